"""End-to-end training on CPU with the real pieces: tiny model, tiny_arith env, local sandbox,
embedded engine, torch learner with VCPO, partial-rollout buffer."""

from __future__ import annotations

import math

import pytest
from float_bounds import TINY_LOGPROB_ATOL, sum_atol
from loop_paths import DENSE_ENV

from agent_rl import checkpoint
from agent_rl.evaluate import evaluate
from agent_rl.metrics import read_metrics
from agent_rl.trainer import train
from agent_rl.viewer.plot import STANDARD_CURVES

TRAIN_KEYS = (
    "vcpo/ess_ratio",
    "vcpo/lr_scale",
    "buffer/staleness_mean",
    "buffer/staleness_max",
    "learner/grad_norm",
)


def _check_async_run(records: list[dict[str, float]], k: int) -> None:
    for r in records:
        for key in TRAIN_KEYS:
            assert key in r and math.isfinite(r[key]), f"step {r['step']}: {key} missing or not finite"
        # ESS/B <= 1 (Cauchy-Schwarz), computed in float64 over B <= 1e3 weights: rounding ~B·eps64 ≈ 2e-13
        assert 0 < r["vcpo/ess_ratio"] <= 1 + 1e-9 and 0 < r["vcpo/lr_scale"] <= 1 + 1e-9
        assert r["buffer/staleness_max"] <= k
    assert max(r["buffer/staleness_max"] for r in records) > 0, (
        "k>0 but no batch was ever stale: not asynchronous"
    )


def test_async_k2_run_writes_finite_ess_lr_scale_and_staleness(smoke_recipe) -> None:
    recipe = smoke_recipe("buffer.max_staleness=2", "train.steps=5", "eval.limit=4", "checkpoint.every=0")
    run_dir = train(recipe)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(5))
    _check_async_run(records, k=2)
    logged = set().union(*records)
    for keys in STANDARD_CURVES.values():  # every standard curve but eval (off in this run) is drawn
        assert any(k in logged for k in keys)
    report = evaluate(recipe, run_dir)  # the run dir's latest checkpoint, through its hf/ export
    assert report.tasks == 4 and 0.0 <= report.accuracy <= 1.0 and report.tokens_per_s > 0
    assert checkpoint.latest(run_dir).name == "step_000005"


def test_k0_is_on_policy_every_token_from_the_current_version(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "buffer.max_staleness=0",
        f"envs.train={DENSE_ENV}",
        "buffer.mask_void=false",
        "learner.lr=3e-3",
        "train.steps=4",
    )
    records = read_metrics(train(recipe))
    for step, r in enumerate(records):
        assert r["learner/batch_min_version"] == r["learner/batch_max_version"] == step
        assert r["learner/staleness_max"] == 0 and r["learner/partial_rollout_ratio"] == 0
        # exp(Σ_t log π − log μ) over at most 512 tokens, each term rounding alone (tests/float_bounds.py)
        w = math.expm1(sum_atol(512))
        assert abs(r["vcpo/is_weight_max"] - 1) <= w and abs(r["vcpo/is_weight_min"] - 1) <= w
    # the policy did move (so equal IS weights are a property of k=0, not of a frozen model)
    assert any(r["learner/grad_norm"] > 0 for r in records)


def test_fixed_lag_makes_every_batch_exactly_k_stale(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "rollout.fixed_lag=2",
        f"envs.train={DENSE_ENV}",
        "buffer.mask_void=false",
        "learner.lr=3e-3",
        "train.steps=5",
        "eval.every=5",
        "eval.limit=4",
    )
    records = read_metrics(train(recipe))
    for step, r in enumerate(records):
        lag = min(step, 2)  # the first k batches can only be sampled by version 0
        assert r["learner/staleness_max"] == r["learner/staleness_mean"] == lag
        assert r["learner/batch_min_version"] == r["learner/batch_max_version"] == step - lag
    assert records[-1]["vcpo/log_ratio_abs_max"] > TINY_LOGPROB_ATOL, (
        "stale batches but the policy ratio never moved"
    )
    # the periodic eval runs on the engines, so it says which (lagged) policy it measured
    assert records[-1]["learner/version"] == 5 and records[-1]["eval/policy_version"] == 3


# make test-heavy: the 5-step k=2 run above checks the same per-step properties in make test (docs/tests.md, per directory)
@pytest.mark.slow
@pytest.mark.heavy
def test_two_minute_async_run_with_vcpo(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "buffer.max_staleness=2", "train.steps=60", "train.batch_prompts=4", "checkpoint.every=20"
    )
    records = read_metrics(train(recipe))
    assert len(records) == 60
    _check_async_run(records, k=2)
