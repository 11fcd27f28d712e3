"""The torch learner reports, per trajectory uid, the current log-probs, weight, baseline and advantage it trained with."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from float_bounds import TINY_LOGPROB_ATOL, sum_atol

from agent_rl.config import Recipe
from agent_rl.learners import build
from agent_rl.types import Group, Trajectory
from vcpo.logprobs import logprobs_of

pytestmark = pytest.mark.usefixtures("ranks_from_a_fork_server")  # tests/conftest.py


def _model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _groups(model_dir: Path) -> list[Group]:
    """2 prompts x 3 samples of different lengths (so collation reorders rows), behaviour log-probs
    from perturbed weights (a stale policy), a tool segment in the middle."""
    model = _model(model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    groups = []
    for g in range(2):
        trajs = []
        for i in range(3):
            prompt = [5 + g, 6, 7]
            a, env, b = (torch.randint(3, 200, (k,), generator=gen).tolist() for k in (3 + 4 * i, 2, 2 + i))
            ids = torch.tensor([prompt + a + env + b])
            with torch.no_grad():
                lp = logprobs_of(model, ids, torch.ones_like(ids))[0].tolist()
            t = Trajectory(uid=f"g{g}/{i}", group_id=f"g{g}", prompt_ids=prompt)
            t.append_sampled(a, lp[3 : 3 + len(a)], 0)
            t.append_env(env)
            t.append_sampled(b, lp[-len(b) :], 1)
            t.reward = float(i % 2)
            trajs.append(t)
        groups.append(Group(f"g{g}", trajs))
    return groups


def _coefficient_atol(tokens: int) -> float:
    """OPOB's baseline is a mean of the group's rewards (range 1 here) weighted by w²·‖g‖²: a relative change r
    of every weight moves it by at most 2r. r = 2·sum_atol(tokens) (w² = exp(2s), s a sum over the tokens) plus
    the float32 rounding of the squared gradient norms (~1e5 squares: √n·u ≈ 2e-5 relative; 1e-4 covers it).
    The advantage is reward − baseline."""
    return 2 * (2 * sum_atol(tokens) + 1e-4)


def _recipe(model_dir: Path, opob_mode: str, **learner) -> Recipe:
    """Validated from scratch, learner fields included: a model_copy would keep the cached learner_spec."""
    return Recipe.model_validate(
        {
            "name": "rows-test",
            "model": {"path": str(model_dir)},
            "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 4, "batch_prompts": 2},
            # device cpu: the rows are compared with log-probs of the HF model computed here, on the CPU
            "learner": {"lr": 1e-3, "weight_decay": 0.0, "micro_batch_size": 2, "device": "cpu", **learner},
            "algorithm": {"opob_mode": opob_mode},
        }
    )


@pytest.mark.parametrize("opob_mode", ["proxy", "exact"])
def test_trained_rows_are_the_current_logprobs_and_weights_of_each_uid(
    tiny_model_dir: Path, opob_mode: str
) -> None:
    groups = _groups(tiny_model_dir)
    before = _model(tiny_model_dir)  # the weights the step computes its log-probs with
    learner = build(_recipe(tiny_model_dir, opob_mode).learner_spec)
    metrics = learner.step(groups)
    rows = learner.trained_rows()
    assert set(rows) == {t.uid for g in groups for t in g.trajectories}
    for t in (t for g in groups for t in g.trajectories):
        flat = t.flatten()
        ids = torch.tensor([flat.input_ids])
        with torch.no_grad():
            expected = logprobs_of(before, ids, torch.ones_like(ids))[0]
        row = rows[t.uid]
        on = torch.tensor(flat.loss_mask, dtype=torch.bool)
        assert torch.allclose(row.logprobs[: len(flat.input_ids)][on], expected[on], atol=TINY_LOGPROB_ATOL)
        s = float((expected[on] - torch.tensor(flat.behavior_logprobs)[on]).sum())
        assert row.seq_log_weight == pytest.approx(s, abs=sum_atol(int(on.sum())))
        assert math.isfinite(row.baseline) and math.isfinite(row.advantage)
    # the two groups' rewards are (0, 1, 0): members with the same reward share an advantage sign
    for g in groups:
        adv = [rows[t.uid].advantage for t in g.trajectories]
        assert adv[1] > 0 > adv[0] and adv[2] < 0
    mean_w = sum(math.exp(min(r.seq_log_weight, math.log(8.0))) for r in rows.values()) / len(rows)
    # the same log-weights on both sides, summed in another order (float64; 1e-4 would cover float32 too)
    assert mean_w == pytest.approx(metrics["vcpo/is_weight_mean"], rel=1e-4)
    learner.close()


@pytest.mark.slow
def test_data_parallel_ranks_report_the_same_rows_as_one_rank(tiny_model_dir: Path) -> None:
    groups = _groups(tiny_model_dir)
    one = build(_recipe(tiny_model_dir, "proxy").learner_spec)
    one.step(groups)
    expected = one.trained_rows()
    one.close()
    two = build(_recipe(tiny_model_dir, "proxy", dp=2).learner_spec)
    try:
        two.step(groups)
        rows = two.trained_rows()
    finally:
        two.close()
    assert set(rows) == set(expected)
    length = {t.uid: len(t) for g in groups for t in g.trajectories}
    for uid, r in rows.items():
        e, n = expected[uid], length[uid]  # a row's positions past its trajectory are padding
        assert torch.allclose(r.logprobs[:n], e.logprobs[:n], atol=TINY_LOGPROB_ATOL)
        assert r.seq_log_weight == pytest.approx(e.seq_log_weight, abs=sum_atol(n))
        assert r.advantage == pytest.approx(e.advantage, abs=_coefficient_atol(max(length.values())))


@pytest.mark.slow
@pytest.mark.megatron
def test_megatron_tp2_sp_rows_equal_the_torch_learners(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core not installed: pip install 'agent-rl[dev]'")
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    # vocabulary and heads divisible by tp=2, as Megatron needs
    model_dir = build_tiny(
        tmp_path / "m",
        sample_corpus(),
        vocab_size=320,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=128,
    )
    groups = _groups(model_dir)
    base = _recipe(model_dir, "exact")
    torch_learner = build(base.learner_spec)
    torch_learner.step(groups)
    expected = torch_learner.trained_rows()
    torch_learner.close()
    learner = build(
        _recipe(model_dir, "exact", backend="megatron", tp=2, sp=True).learner_spec, pool="processes"
    )
    try:
        learner.step(groups)
        rows = learner.trained_rows()
    finally:
        learner.close()
    assert set(rows) == set(expected)
    for t in (t for g in groups for t in g.trajectories):
        flat, r, e = t.flatten(), rows[t.uid], expected[t.uid]
        on = torch.tensor(flat.loss_mask, dtype=torch.bool)
        n = len(flat.input_ids)
        assert torch.allclose(r.logprobs[:n][on], e.logprobs[:n][on], atol=TINY_LOGPROB_ATOL)
        assert r.seq_log_weight == pytest.approx(e.seq_log_weight, abs=sum_atol(n))
        assert r.advantage == pytest.approx(e.advantage, abs=_coefficient_atol(n))
        assert r.baseline == pytest.approx(e.baseline, abs=_coefficient_atol(n))
