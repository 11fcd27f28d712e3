"""Building a learner is two independent choices made in agent_rl/learners/__init__.py: the rank kind
(learner.backend) and the pool (where the ranks run); learner.device picks each rank's device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learner_helpers import CPU, make_groups, recipe_for

from agent_rl.errors import UserError
from agent_rl.learners import build, pool_for, rank_kind
from agent_rl.learners._pool import rank_device

needs_no_gpu = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the choice on a machine without a GPU"
)


@needs_no_gpu
def test_without_a_gpu_auto_and_cpu_give_the_cpu_and_cuda_is_refused_naming_the_field() -> None:
    assert rank_device("auto", 0, 1) == "cpu" and rank_device("cpu", 1, 2) == "cpu"
    with pytest.raises(
        UserError, match=r"learner.device: cuda needs one GPU per learner rank .* torch sees 0"
    ):
        rank_device("cuda", 0, 1)


def test_the_pool_follows_the_placement_not_the_rank_kind(tiny_model_dir: Path) -> None:
    one = recipe_for(tiny_model_dir).learner_spec
    two = recipe_for(tiny_model_dir, learner={"dp": 2}).learner_spec
    assert rank_kind(one).name == "torch" and rank_kind(two).world == 2
    assert pool_for(rank_kind(one), one, None) == "inprocess"  # Ray is not up in this test process
    assert pool_for(rank_kind(two), two, None) == "processes"
    assert pool_for(rank_kind(one), one, ((0,),)) == "processes"  # placement.topology: processes


def test_one_rank_steps_alike_in_this_process_and_in_a_worker_process(tiny_model_dir: Path) -> None:
    """The same kind in two pools computes the same update."""
    spec = recipe_for(tiny_model_dir, learner=CPU).learner_spec
    groups = make_groups(tiny_model_dir, n_groups=2, n=2, noise=0.02)
    here = build(spec)
    assert here.local is not None
    there = build(spec, pool="processes")
    try:
        assert there.local is None
        m_here, m_there = here.step(groups), there.step(groups)
        w_here, w_there = here.hf_state_dict(), there.hf_state_dict()
    finally:
        there.close()
    for key in ("learner/loss", "learner/grad_norm", "vcpo/ess", "vcpo/baseline_mean"):
        # one thread here vs the worker's share of the cores: reductions may be split differently, fp32 sums
        # of ~40 tokens -> 1e-5 relative
        assert m_there[key] == pytest.approx(m_here[key], rel=1e-5, abs=1e-7), key
    assert w_here.keys() == w_there.keys() and here.version == there.version == 1
