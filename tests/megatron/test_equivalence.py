"""The Megatron learner computes the torch learner's update: TP=1 and TP=2 with sequence parallelism.

Same HF weights, same groups -> same loss, per-trajectory gradient norms, ESS, baseline,
clipped gradient norm and updated weights (gathered back to HF names), to float tolerance.
Megatron ranks run as gloo worker processes on the CPU (the CPU compatibility layer).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from _helpers import build_tiny_dir, make_groups, recipe, requires_megatron, trajectory_grad_norms_worker

from agent_rl.batch import collate

pytestmark = requires_megatron

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
}


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request):
    return CASES[request.param]


@pytest.fixture(scope="module")
def torch_run(model_dir, batches, case):
    from agent_rl.learners import build

    learner = build(recipe(model_dir, case[1]).learner_spec)
    metrics = [dict(learner.step(b)) for b in batches]
    return metrics, learner.hf_state_dict()


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
    ref_metrics, _ = torch_run
    metrics, _, _, _ = megatron_run
    for step, (ref, got) in enumerate(zip(ref_metrics, metrics, strict=True)):
        assert ref["learner/grad_norm"] > 0.1  # real gradients, not a degenerate batch
        for key in COMPARED:
            assert got[key] == pytest.approx(ref[key], rel=2e-4, abs=1e-6), f"step {step} {key}"


def test_megatron_updated_weights_equal_torch_learner_after_conversion(model_dir, torch_run, megatron_run):
    """Each tensor's update (new - initial) equals the torch learner's to 0.1% in norm, every element to 10% of lr.

    Adam turns float noise in a near-zero gradient element into a visible part of ±lr, so single
    elements get a loose bound; a wrong gradient would shift whole tensors by ~lr.
    """
    from transformers import AutoModelForCausalLM

    _, ref = torch_run
    _, got, _, _ = megatron_run
    lr = recipe(model_dir).learner.lr
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert set(got) == set(ref) == set(initial)
    for k, v in ref.items():
        want, have = v - initial[k], got[k] - initial[k]
        assert float(want.norm()) > 0.0, f"{k} did not move"
        assert float((have - want).norm() / want.norm()) < 1e-3, k
        torch.testing.assert_close(got[k], v, rtol=0, atol=0.1 * lr, msg=lambda m, k=k: f"{k}: {m}")


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

    torch.multiprocessing.spawn(
        trajectory_grad_norms_worker, args=(2, free_port(), str(model_dir), True, batch, str(out)), nprocs=2
    )
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
