"""Data parallel over worker processes (gloo): dp=2 computes dp=1's update; a failing rank stops the pool.

The two tests share one dp=2 learner (spawning ranks is the expensive part) and run in file order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from multiprocessing import resource_sharer
from pathlib import Path

import pytest
import torch
from learner_helpers import CPU, _load, first_gradient, make_groups, recipe_for

from agent_rl.batch import collate
from agent_rl.learners import build
from agent_rl.learners._pool import RankError
from agent_rl.learners.facade import RankLearner


@pytest.fixture(scope="module")
def dp2(tiny_model_dir: Path) -> Iterator[RankLearner]:
    # on a machine with one GPU, two ranks get none (device auto) while one rank would take it: pinned to
    # the CPU so that dp=1 and dp=2 are compared on one device
    learner = build(recipe_for(tiny_model_dir, learner={"dp": 2, **CPU}).learner_spec)
    yield learner
    learner.close()


def test_dp2_equals_dp1_on_the_same_global_batch(
    tiny_model_dir: Path, dp2: RankLearner, tmp_path: Path
) -> None:
    groups = make_groups(tiny_model_dir, n_groups=3, n=2, noise=0.02)  # 2 + 1 groups: unequal shards
    one = build(recipe_for(tiny_model_dir, learner=CPU).learner_spec)
    m1 = one.step(groups)
    m2 = dp2.step(groups)
    # fp32 sums over ~60 tokens and 2 ranks in another order: relative rounding ~ 1e2 u = 1e-5
    for key in (
        "learner/loss",
        "learner/grad_norm",
        "vcpo/ess_ratio",
        "vcpo/is_weight_mean",
        "learner/tokens",
    ):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    one.save(tmp_path / "one")
    dp2.save(tmp_path / "two")
    g1, g2 = first_gradient(tmp_path / "one"), first_gradient(tmp_path / "two")
    assert g1.keys() == g2.keys()
    for k in g1:
        # each gradient element is an fp32 sum over the batch's tokens (~60) and the two ranks, in another
        # order on dp=2: its error is ~ n u times the magnitude of the terms, bounded by the tensor's largest
        # element; 1e-5 of it is ~ 80 u (u = 1.2e-7)
        scale = float(g1[k].abs().max())
        assert scale > 0, k
        torch.testing.assert_close(
            g2[k], g1[k], rtol=0, atol=1e-5 * scale, msg=lambda m, k=k: f"param {k}: {m}"
        )
    initial = _load(str(tiny_model_dir)).state_dict()
    s1 = one.hf_state_dict()
    assert any(not torch.equal(s1[k], initial[k]) for k in s1)  # the step did change the weights


def test_rank_failing_while_the_other_waits_in_a_collective_raises_promptly(
    tiny_model_dir: Path, dp2: RankLearner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 is killed when rank 1 fails, perhaps still reading its batch: the batch went by copy, so no handle
    of this process's is left half-fetched (a tensor sent as a shared-memory handle is fetched from this
    process's resource sharer, which printed a ConnectionResetError traceback when the fetching rank died)."""
    pool = dp2.pool
    batch = collate(make_groups(tiny_model_dir)).policy
    handles: list[object] = []  # what this process offers its resource sharer (a spy: each is still served)
    register = resource_sharer._resource_sharer.register
    monkeypatch.setattr(
        resource_sharer._resource_sharer, "register", lambda *a: handles.append(a) or register(*a)
    )
    t0 = time.monotonic()
    with pytest.raises(RankError, match="(?s)learner rank 1: .*AttributeError"):
        pool.call("step", [(batch,), ("not a batch",)])  # rank 0 blocks in the gradient all-reduce
    assert time.monotonic() - t0 < 60  # not the 30-minute collective timeout
    assert not pool._procs  # every rank was stopped
    assert not handles, "the step's batch went to the ranks as shared-memory handles, not by copy"
