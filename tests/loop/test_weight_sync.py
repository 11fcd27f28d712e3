"""Which weights reach the engines when: every step, every m steps, or exactly `lag` versions behind."""

from __future__ import annotations

from pathlib import Path

import torch

from agent_rl.rollout import LoopThread
from agent_rl.weight_sync import WeightSync


class FakeLearnerWeights:
    """The two Learner members WeightSync reads; weight value = version, so the pushed version is visible."""

    def __init__(self) -> None:
        self.version = 0

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {"w": torch.full((2,), float(self.version))}


class FakeEngineRecorder:
    def __init__(self) -> None:
        self.log: list[tuple[str, int | None, float | None]] = []

    async def pause(self) -> None:
        self.log.append(("pause", None, None))

    async def resume(self) -> None:
        self.log.append(("resume", None, None))

    async def update_weights(self, *, version: int, path=None, tensors=None) -> None:
        self.log.append(("update", version, float(tensors["w"][0])))


def _pushes(tmp_path: Path, steps: int, **kw) -> list[tuple[int, float]]:
    loop, engine, learner = LoopThread(), FakeEngineRecorder(), FakeLearnerWeights()
    sync = WeightSync(engine, loop, mode="memory", scratch=tmp_path, **kw)
    try:
        for _ in range(steps + 1):
            sync.push(learner)
            learner.version += 1
    finally:
        loop.close()
    ops = [op for op, _, _ in engine.log]
    assert ops == ["pause", "update", "resume"] * (len(ops) // 3), "an update outside pause/resume"
    return [(v, w) for op, v, w in engine.log if op == "update"]


def test_every_step_pushes_each_version_once(tmp_path: Path) -> None:
    assert _pushes(tmp_path, 3) == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]


def test_sync_every_m_steps_skips_the_versions_between(tmp_path: Path) -> None:
    assert _pushes(tmp_path, 5, every=2) == [(0, 0.0), (2, 2.0), (4, 4.0)]


def test_fixed_lag_pushes_the_weights_of_lag_versions_ago(tmp_path: Path) -> None:
    # versions 1 and 2 still map to version 0 (nothing to push); then 3 -> 1, 4 -> 2, 5 -> 3
    assert _pushes(tmp_path, 5, lag=2) == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]
