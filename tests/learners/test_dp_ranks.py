"""Worker-process ranks: a rank that fails mid-step stops the pool instead of hanging it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from learner_helpers import make_groups, recipe_for

from agent_rl.batch import collate
from agent_rl.learners._dp import RankError, RankPool
from agent_rl.learners.torch_learner import rank_spec


def test_rank_failing_while_the_other_waits_in_a_collective_raises_promptly(tiny_model_dir: Path) -> None:
    pool = RankPool(rank_spec(recipe_for(tiny_model_dir)), 2)
    batch = collate(make_groups(tiny_model_dir)).policy
    t0 = time.monotonic()
    with pytest.raises(RankError, match="(?s)learner rank 1: .*AttributeError"):
        pool.call("step", [(batch,), ("not a batch",)])  # rank 0 blocks in the gradient all-reduce
    assert time.monotonic() - t0 < 60  # not the 30-minute collective timeout
    assert not pool._procs  # every rank was stopped
