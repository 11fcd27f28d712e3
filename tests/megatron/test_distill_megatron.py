"""On-policy distillation on the Megatron learner: with teacher log-probs in the batch, a MegatronRank's gradient
(TP=2 with sequence parallelism, the layout where the gradient needs the most finishing; gloo processes on the CPU)
equals vcpo.Step's on the HF model with the same DistillConfig, for the reverse KL as a reward beside the task (exact OPOB, a separate distillation pass) and as
a loss alone; and the distillation metrics agree. The torch learner's own distillation tests: tests/vcpo/test_distill.py."""

from __future__ import annotations

import pytest
import torch
from _helpers import build_tiny_dir, make_groups, recipe, reference_step, requires_megatron, run_rank_steps

from agent_rl.batch import collate

pytestmark = requires_megatron

TOKENS = 120  # make_groups: 6 trajectories of 13-28 tokens
GRAD_RTOL = TOKENS * 2.0**-23
"""‖g_megatron − g_hf‖ <= TOKENS · FP32_EPS · ‖g_hf‖ per tensor: a weight gradient sums <= TOKENS per-token terms in
another order (and over TP / SP splits); first-order bound of that sum's rounding (as test_equivalence.py)."""
METRIC_RTOL = (
    2e-4  # sums over <= TOKENS tokens of terms through a few dozen fp32 roundings (test_equivalence.py)
)

CASES = {  # (learner layout, algorithm.teacher)
    "tp2-sp-reward+task-exact": (
        {"tp": 2, "sp": True},
        {"mode": "reward", "weight": 1.0, "task_weight": 1.0},
    ),
    "tp2-sp-loss-alone": ({"tp": 2, "sp": True}, {"mode": "loss", "weight": 0.5, "task_weight": 0.0}),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_dir(tmp_path_factory.mktemp("megatron_distill"))


@pytest.fixture(scope="module")
def batch(model_dir):
    """make_groups' batch with a teacher's log-prob on every sampled token: the behaviour's, moved by -0.5..+0.5
    and kept <= 0 (the student and the teacher disagree token by token, both ways)."""
    groups = make_groups(model_dir, seed=0)
    g = torch.Generator().manual_seed(1)
    for group in groups:
        for t in group.trajectories:
            behaviour = torch.tensor([lp for seg in t.segments if seg.sampled for lp in seg.logprobs])
            shift = torch.rand(len(behaviour), generator=g) - 0.5
            t.set_teacher_logprobs((behaviour + shift).clamp(max=-1e-3).tolist())
    return collate(groups).policy


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def records(request, model_dir, batch, tmp_path_factory):
    from agent_rl.learners.megatron import megatron_spec

    layout, teacher = CASES[request.param]
    algorithm = {"teacher": {"engine": str(model_dir), **teacher}}
    spec = megatron_spec(recipe(model_dir, algorithm, backend="megatron", **layout).learner_spec)
    assert spec.rank.step.distill is not None
    got = run_rank_steps({"m": spec}, [batch], tmp_path_factory.mktemp("distill"))["m"]
    return got, reference_step(model_dir, spec, batch)


def test_megatron_distillation_gradient_equals_vcpo_on_the_hf_model(records):
    got, ref = records
    assert set(got["grads"]) == set(ref["grads"])
    assert sum(float(g.norm()) for g in ref["grads"].values()) > 0.0
    for name, g in ref["grads"].items():
        err = float((got["grads"][name] - g).norm()) / max(float(g.norm()), 1e-30)
        assert err <= GRAD_RTOL or float(g.norm()) == 0.0, f"{name}: relative gradient error {err:.3g}"


def test_megatron_distillation_metrics_equal_vcpo_on_the_hf_model(records):
    got, ref = records
    keys = [k for k in ref["metrics"] if k.startswith("distill/")]
    assert "distill/reverse_kl" in keys
    for k in keys:
        assert got["metrics"][k] == pytest.approx(ref["metrics"][k], rel=METRIC_RTOL, abs=1e-6), k
