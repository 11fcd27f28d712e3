"""`agent-rl train` with algorithm.teacher: the teacher scores what the rollouts sample, the learner distils.

The teacher here is the student's own starting weights, so at step 0 (every token sampled by version 0,
the learner still at version 0) the per-token reverse KL is only the gap between two fp32 forwards of the
same weights (the learner's transformers forward, the teacher engine's prefill).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agent_rl.config import load_recipe
from agent_rl.trainer import train
from agent_rl.viewer.log import read_step

ROOT = Path(__file__).resolve().parents[2]
# tests/engines/test_engine_correctness.py bounds the embedded engine's fp32 log-probs against transformers' by
# 1e-4 per token; a mean of such gaps is within the same bound (a teacher with other weights: O(1))
SAME_WEIGHTS_KL = 1e-4


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("topology", ["inprocess", "processes"])
def test_train_distils_with_the_teacher_scoring_every_sampled_token(tiny_model_dir, tmp_path, topology):
    sets = [
        f"model.path={tiny_model_dir}",
        f"logging.run_dir={tmp_path / 'run'}",
        "logging.trajectories=all",
        "train.steps=3",
        f"algorithm.teacher.engine={tiny_model_dir}",
        "algorithm.teacher.task_weight=0",
    ]
    if topology == "processes":  # the teacher is an `agent-rl serve` process on the engine cores
        sets += ["placement.topology=processes", "engines.weight_sync=disk", "train.steps=2"]
    recipe = load_recipe(ROOT / "recipes" / "tiny_tir_smoke.yaml", sets)
    run_dir = train(recipe)
    records = _records(run_dir)
    assert [r["step"] for r in records] == list(range(recipe.train.steps))
    for r in records:
        for key in (
            "distill/reverse_kl",
            "distill/teacher_logprob",
            "distill/disagree_frac",
            "teacher/wait_seconds",
        ):
            assert math.isfinite(r[key]), (key, r[key])
        assert r["learner/skipped"] == 0.0
    assert sum(r["teacher/scored_tokens"] for r in records) > 0
    first = records[0]
    assert first["learner/staleness_max"] == 0 and abs(first["distill/reverse_kl"]) <= SAME_WEIGHTS_KL
    # the trajectory log carries the teacher's score of every sampled token, next to the behaviour log-prob
    for t in read_step(run_dir, 0).trajectories:
        for s in t.segments:
            if s.sampled:
                assert len(s.teacher_logprobs) == len(s.behavior_logprobs) == len(s.token_ids)
            else:
                assert s.teacher_logprobs == []
