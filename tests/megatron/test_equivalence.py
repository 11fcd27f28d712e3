"""The Megatron learner computes the torch learner's update: TP=1, TP=2 with sequence parallelism, DP=2, CP=2.

Same HF weights, same groups -> same loss, per-trajectory gradient norms, ESS, baseline and
clipped gradient norm; the same gradient (gathered back to HF names) as vcpo.Step on the HF
model, and an update that is AdamW of exactly that gradient, to float tolerance.
Megatron ranks run as gloo worker processes on the CPU (the CPU compatibility layer).

Weights after an Adam step are not compared with the torch learner's: Adam moves an element
whose gradient is near zero by up to ~lr whatever float noise that gradient carries, so those
weights differ by up to ~lr between two correct implementations (issue 39). The gradient is
compared instead, and the update against AdamW replayed on the learner's own gradient.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from _helpers import (
    adamw_replay,
    build_tiny_dir,
    make_groups,
    recipe,
    reference_step,
    requires_megatron,
    run_rank_steps,
    spawn_ranks,
    trajectory_grad_norms_worker,
)

from agent_rl.batch import collate, split_groups

pytestmark = requires_megatron

FP32_EPS = 2.0**-23
TOKENS = 120
"""Upper bound on a test batch's tokens (make_groups: 6 trajectories of 13-28 tokens)."""
METRIC_RTOL = 2e-4
"""Step metrics, fp32, two implementations: sums over <= TOKENS tokens of terms that each pass through a few dozen
roundings (two layers, softmax, exp of the sequence log-ratio): <= TOKENS · 16 · FP32_EPS ≈ 2e-4, first order."""
GRAD_RTOL = TOKENS * FP32_EPS
"""‖g_megatron − g_hf‖ <= TOKENS · FP32_EPS · ‖g_hf‖ per tensor: a weight gradient sums <= TOKENS per-token terms in
another order (and TP / CP splits); first-order bound of that sum's rounding."""
ADAM_ATOL_PER_LR = 1e-5
"""AdamW replayed on the learner's own captured gradient: the same fp32 element-wise ops; a few ulps of an update
that is at most lr."""
ADAM_WEIGHT_RTOL = 2 * 2.0**-24
"""The new weight is rounded to float32 once more: the learner's AdamW kernel (CUDA's foreach / fused ones, or
another CPU vector width) and the replay may land on neighbouring floats: one unit of float32 rounding (2^-24
relative) on each side (seen on an H200: model.norm.weight 1.19e-7 apart at |w| = 1, lr 2.7e-3)."""

COMPARED = [
    "learner/loss",
    "learner/grad_norm",
    "learner/lr_effective",
    "vcpo/ess",
    "vcpo/traj_grad_norm_mean",
    "vcpo/traj_grad_norm_max",
    "vcpo/baseline_mean",
    "vcpo/advantage_std",
    "vcpo/is_weight_mean",
    "vcpo/kl_behavior_current",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_dir(tmp_path_factory.mktemp("megatron_tiny"))


@pytest.fixture(scope="module")
def batches(model_dir):
    return [make_groups(model_dir, seed) for seed in range(2)]


# (learner layout, algorithm): VCPO (exact OPOB, one backward per trajectory) and a token-level
# loss with GRPO advantages (vcpo's micro-batched path, gradients finished once per step).
CASES = {
    "tp1": ({}, {}),
    "tp2-sp": ({"tp": 2, "sp": True}, {}),
    # packed micro-batches of at most 48 real tokens (2-3 trajectories each)
    "tp2-sp-ppo-grpo": (
        {"tp": 2, "sp": True, "micro_batch_tokens": 48},
        {"loss": "ppo_clip", "advantage": "grpo"},
    ),
    "tp1-ppo-padded": ({"pack_sequences": False}, {"loss": "ppo_clip", "advantage": "grpo"}),
    "dp2": ({"dp": 2}, {}),  # one group per DP rank: baselines local, ESS and gradients reduced over DP
    "cp2": ({"cp": 2}, {}),  # torch-SDPA attention over K/V all-gathered across 2 CP ranks
}


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request):
    return CASES[request.param]


@pytest.fixture(scope="module")
def torch_run(model_dir, batches, case):
    from agent_rl.learners import build

    learner = build(recipe(model_dir, case[1]).learner_spec)
    return dict(learner.step(batches[0]))


@pytest.fixture(scope="module")
def megatron_run(case, model_dir, batches, tmp_path_factory):
    """Two steps, then a checkpoint round trip: save, step, load, step again."""
    from agent_rl.learners import build

    layout, algorithm = case
    learner = build(recipe(model_dir, algorithm, backend="megatron", **layout).learner_spec, pool="processes")
    try:
        metrics = [dict(learner.step(b)) for b in batches]
        weights = learner.hf_state_dict()
        ckpt = tmp_path_factory.mktemp("ckpt")
        learner.save(ckpt)
        after_save = dict(learner.step(batches[0]))
        learner.load(ckpt)
        resumed = {
            "version": learner.version,
            "weights": learner.hf_state_dict(),
            "metrics": dict(learner.step(batches[0])),
        }
        return metrics, weights, after_save, resumed
    finally:
        learner.close()


def test_megatron_step_metrics_equal_torch_learner(torch_run, megatron_run):
    """The first step (both from the same weights); later steps start from weights that Adam made differ."""
    ref = torch_run
    metrics, _, _, _ = megatron_run
    got = metrics[0]
    assert ref["learner/grad_norm"] > 0.1  # real gradients, not a degenerate batch
    for key in COMPARED:
        assert got[key] == pytest.approx(ref[key], rel=METRIC_RTOL, abs=1e-6), key


@pytest.fixture(scope="module")
def step_records(case, model_dir, batches, tmp_path_factory):
    """One step of a MegatronRank per DP rank (gloo processes) and of vcpo.Step on the HF model, same batch."""
    from agent_rl.learners.megatron import megatron_spec

    layout, algorithm = case
    spec = megatron_spec(recipe(model_dir, algorithm, backend="megatron", **layout).learner_spec)
    shares = [collate(share).policy for share in split_groups(batches[0], spec.dp)]
    got = run_rank_steps({"megatron": spec}, shares, tmp_path_factory.mktemp("steps"))["megatron"]
    return spec, got, reference_step(model_dir, spec, collate(batches[0]).policy)


def test_megatron_step_gradient_equals_vcpo_on_the_hf_model(step_records):
    """The gradient the optimizer steps with (after the DP sum, the TP/SP/CP reductions and clipping), in HF names."""
    _, got, ref = step_records
    assert set(got["grads"]) == set(ref["grads"])
    for name, g in ref["grads"].items():
        err = float((got["grads"][name] - g).norm()) / max(float(g.norm()), 1e-30)
        assert err <= GRAD_RTOL or float(g.norm()) == 0.0, f"{name}: relative gradient error {err:.3g}"


def test_megatron_update_is_adamw_of_its_gradient_in_hf_names(model_dir, step_records):
    """The weights handed out after the step are AdamW (the learner's betas, decay groups, ESS-scaled lr) of that
    gradient from the initial weights: the optimizer, the gather and the HF conversion of the update are exact."""
    from transformers import AutoModelForCausalLM

    spec, got, _ = step_records
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    lr = got["metrics"]["lr"]
    want = adamw_replay(initial, got["grads"], spec, lr)
    assert set(got["weights"]) == set(initial)
    for k, w in got["weights"].items():
        assert float((w - initial[k]).abs().max()) > 0.0, f"{k} did not move"
        torch.testing.assert_close(
            w, want[k], rtol=ADAM_WEIGHT_RTOL, atol=ADAM_ATOL_PER_LR * lr, msg=lambda m, k=k: f"{k}: {m}"
        )


def test_checkpoint_load_restores_weights_version_and_next_step(megatron_run):
    _, weights, after_save, resumed = megatron_run
    assert resumed["version"] == 2
    for k, v in weights.items():
        assert torch.equal(resumed["weights"][k], v), k
    for key in COMPARED:
        assert resumed["metrics"][key] == pytest.approx(after_save[key], rel=1e-6, abs=1e-9), key


def test_per_trajectory_grad_norms_at_tp2_sp_equal_hf(model_dir, batches, tmp_path, monkeypatch):
    """Each trajectory's ‖∇ mean_t log π‖ under TP=2+SP (SP norm grads summed over TP, TP-duplicates
    counted once) equals the HF model's, and so do its log-probs."""
    # The workers build CPU shards over gloo, but megatron's rank code (init_model_parallel) picks CUDA by
    # torch.cuda.is_available(): on a GPU machine the TP collectives and RNG tracker went to CUDA. Hide the
    # GPU from the spawned workers (they inherit the environment); the HF reference runs on the CPU too.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    from transformers import AutoModelForCausalLM

    from vcpo.logprobs import logprobs_of

    batch = collate(batches[0]).policy
    out = tmp_path / "norms.pt"
    from agent_rl.learners._pool import free_port

    spawn_ranks(trajectory_grad_norms_worker, (2, free_port(), str(model_dir), True, batch, str(out)), 2)
    got = torch.load(out)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for i in range(batch.size):
        sub = batch.select(torch.tensor([i]))
        hf.zero_grad(set_to_none=True)
        lp = logprobs_of(hf, sub.input_ids, sub.attention_mask)
        ((lp * sub.loss_mask).sum() / sub.loss_mask.sum()).backward()
        ref = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in hf.parameters()))
        assert got["norms"][i] == pytest.approx(ref, rel=1e-5), f"trajectory {i}"
        n = int(sub.attention_mask.sum())
        torch.testing.assert_close(got["logprobs"][i][1:n], lp.detach()[0, 1:n], rtol=1e-5, atol=1e-5)


def test_all_masked_batch_is_skipped_like_the_torch_learner(model_dir, batches):
    from agent_rl.learners import build

    groups = copy.deepcopy(batches[0])
    for g in groups:
        for t in g.trajectories:
            t.masked = True
    learner = build(recipe(model_dir, backend="megatron").learner_spec, pool="processes")
    try:
        before = learner.hf_state_dict()
        m = learner.step(groups)
        assert m["learner/skipped"] == 1.0 and learner.version == 0
        after = learner.hf_state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)
    finally:
        learner.close()
