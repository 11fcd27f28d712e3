"""Data parallel over worker processes (gloo): dp=2 computes dp=1's update; a failing rank stops the pool.

The two tests share one dp=2 learner (spawning ranks is the expensive part) and run in file order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from learner_helpers import _load, make_groups, recipe_for

from agent_rl.batch import collate
from agent_rl.learners._dp import RankError
from agent_rl.learners.torch_learner import TorchLearner, build_learner


@pytest.fixture(scope="module")
def dp2(tiny_model_dir: Path) -> Iterator[TorchLearner]:
    learner = build_learner(recipe_for(tiny_model_dir, learner={"dp": 2}).learner_spec)
    assert isinstance(learner, TorchLearner)
    yield learner
    learner.close()


def test_dp2_equals_dp1_on_the_same_global_batch(tiny_model_dir: Path, dp2: TorchLearner) -> None:
    groups = make_groups(tiny_model_dir, n_groups=3, n=2, noise=0.02)  # 2 + 1 groups: unequal shards
    one = build_learner(recipe_for(tiny_model_dir).learner_spec)
    m1 = one.step(groups)
    m2 = dp2.step(groups)
    s1, s2 = one.hf_state_dict(), dp2.hf_state_dict()
    for key in (
        "learner/loss",
        "learner/grad_norm",
        "vcpo/ess_ratio",
        "vcpo/is_weight_mean",
        "learner/tokens",
    ):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    for k in s1:  # Adam's first step is ~lr * sign(g): summation order can move a near-zero entry a little
        torch.testing.assert_close(s2[k], s1[k], rtol=1e-5, atol=1e-5)
    initial = _load(str(tiny_model_dir)).state_dict()
    assert any(not torch.equal(s1[k], initial[k]) for k in s1)  # the step did change the weights


def test_rank_failing_while_the_other_waits_in_a_collective_raises_promptly(
    tiny_model_dir: Path, dp2: TorchLearner
) -> None:
    pool = dp2._pool
    assert pool is not None
    batch = collate(make_groups(tiny_model_dir)).policy
    t0 = time.monotonic()
    with pytest.raises(RankError, match="(?s)learner rank 1: .*AttributeError"):
        pool.call("step", [(batch,), ("not a batch",)])  # rank 0 blocks in the gradient all-reduce
    assert time.monotonic() - t0 < 60  # not the 30-minute collective timeout
    assert not pool._procs  # every rank was stopped
