"""The engine-vs-learner log-prob mismatch: only tokens of the learner's current version count, and per
architecture and dtype it stays within bounds (engine samples, one real learner step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_rl.batch import collate
from agent_rl.learners.mismatch import mismatch_metrics
from agent_rl.types import Group, Trajectory
from benchmarks.mismatch import measure, random_model


def test_only_loss_tokens_of_the_current_version_count() -> None:
    t = Trajectory(uid="a", group_id="g", prompt_ids=[1, 2], reward=1.0)
    t.append_sampled([3, 4], [-1.0, -1.0], 4)  # sampled by the version the learner holds: measured
    t.append_env([5])  # tool output: not trained
    t.append_sampled([6, 7], [-2.0, -2.0], 3)  # one version older: differs by design, left out
    batch = collate([Group("g", [t])])
    current = torch.full((1, 7), -1.25)  # learner's log π: 0.25 from μ on the measured tokens
    current[0, 5:] = -9.0  # far off on the stale tokens, which must not count
    m = mismatch_metrics([batch], [current], version=4, threshold=0.2)
    assert m["rollout/logprob_mismatch_tokens"] == 2
    assert m["rollout/logprob_mismatch_mean"] == pytest.approx(0.25)
    assert m["rollout/logprob_mismatch_max"] == pytest.approx(0.25)
    assert m["rollout/logprob_mismatch_frac"] == 1.0
    assert mismatch_metrics([batch], [current], version=9, threshold=0.2) == {
        "rollout/logprob_mismatch_tokens": 0.0
    }


# Bounds with room over what benchmarks/mismatch.py measured (fp32 max ~1.4e-6; bf16 mean ~5e-3, max ~3e-2).
BOUNDS = {"float32": (1e-5, 1e-4), "bfloat16": (0.02, 0.15)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_engine_and_learner_logprobs_agree_per_architecture(
    arch: str, dtype: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from agent_rl.engines.embedded.model import ModelConfig

    model = random_model(arch, tmp_path / arch, tiny_model_dir)
    try:
        ModelConfig.from_dir(model)
    except ValueError as e:
        pytest.skip(f"the embedded engine does not read {arch} here: {e}")
    m = measure(model, dtype, samples=8, tokens=24)
    mean_bound, max_bound = BOUNDS[dtype]
    assert m["tokens"] == 8 * 24
    assert m["mean"] < mean_bound and m["max"] < max_bound, m
