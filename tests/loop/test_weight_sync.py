"""Which weights reach the engines when: every step, every m steps, or exactly `lag` versions behind;
and the broadcast mode (`engines.weight_sync: nccl`), through the whole loop over gloo."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from agent_rl.engines.api import BadRequest
from agent_rl.loop_thread import LoopThread
from agent_rl.weight_sync.lagged import LaggedPublisher
from agent_rl.weight_sync.publish import Publisher
from agent_rl.weights.group import Endpoint, GroupSpec, TensorMeta


class FakeLearnerWeights:
    """The two Learner members a Publisher reads; weight value = version, so the pushed version is visible."""

    def __init__(self) -> None:
        self.version = 0

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {"w": torch.full((2,), float(self.version))}

    def adapter(self) -> None:  # every weight trains
        return None


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
    cls = LaggedPublisher if "lag" in kw else Publisher
    sync = cls(engine, loop, mode="memory", scratch=tmp_path, **kw)
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


# ---- engines.weight_sync: nccl (a torch.distributed broadcast from learner rank 0; gloo on CPU) ----


def test_fixed_lag_with_broadcast_sync_is_refused_when_the_recipe_loads(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from agent_rl.config import Recipe

    recipe = {
        "name": "r",
        "model": {"path": str(tmp_path)},
        "envs": {"train": "envs/tiny_arith.yaml"},
        "train": {"steps": 1, "batch_prompts": 1},
        "engines": {"type": "sglang", "urls": ["http://127.0.0.1:1"], "weight_sync": "nccl"},
        "rollout": {"fixed_lag": 2},
    }
    with pytest.raises(ValidationError, match="fixed_lag=2 cannot run with engines.weight_sync: nccl"):
        Recipe.model_validate(recipe)


class FakeSGLangMemberRefusingUpdates(FakeEngineRecorder):
    """SGLang's weight-group endpoints at the protocol boundary: joins fine, answers every update with a 400."""

    def host(self) -> str:
        return "127.0.0.1"

    async def weight_group_size(self) -> int:
        return 1

    async def init_weights_update_group(self, spec, rank_offset: int) -> None:
        self.log.append(("init", rank_offset, float(spec.world_size)))

    async def update_weights_from_distributed(self, meta, *, version: int, group_name: str) -> None:
        raise BadRequest(f"update_weights_from_distributed: unknown parameter {meta.names[0]!r}")

    async def destroy_weights_update_group(self, group_name: str) -> None:
        self.log.append(("destroy", None, None))


class LearnerStuckInBroadcast(FakeLearnerWeights):
    """A rank 0 whose broadcast never completes (its peers never receive), like a real collective would."""

    def __init__(self) -> None:
        super().__init__()
        self.never = threading.Event()

    def weight_endpoint(self, toward_host: str) -> Endpoint:
        return Endpoint(toward_host, 1, "gloo")

    def join_weight_group(self, spec: GroupSpec) -> TensorMeta:
        return TensorMeta.of(self.hf_state_dict())

    def broadcast_weights(self) -> None:
        self.never.wait()


def test_engine_refusing_a_broadcast_update_fails_the_push_at_once_and_resumes(tmp_path: Path) -> None:
    loop, engine, learner = LoopThread(), FakeSGLangMemberRefusingUpdates(), LearnerStuckInBroadcast()
    try:
        sync = Publisher(engine, loop, mode="nccl", scratch=tmp_path)
        with pytest.raises(BadRequest, match="unknown parameter 'w'"):
            sync.push(learner)  # does not wait for the learner's blocked broadcast
        sync.close()
    finally:
        learner.never.set()
        loop.close()
    assert [op for op, _, _ in engine.log] == ["init", "pause", "resume", "destroy"]
    assert engine.log[0][1:] == (1, 2.0)  # engine rank 1 of a world of 2 (learner rank 0 + one engine rank)


@pytest.mark.timeout(1800)  # a guard for a hung gloo group, not a speed limit (~300 s on a loaded machine)
def test_broadcast_sync_over_gloo_keeps_the_engines_on_the_learners_version(smoke_recipe) -> None:
    """The full loop with two embedded engine servers joined to the learner's gloo group, k=0: every batch
    was sampled by the version the learner had then, so each push reached both engines."""
    from agent_rl.metrics import read_metrics
    from agent_rl.trainer import train

    recipe = smoke_recipe(
        "engines.weight_sync=nccl",
        "engines.count=2",
        "buffer.max_staleness=0",
        f"envs.train={Path(__file__).parent / 'data' / 'tiny_arith_dense.yaml'}",
        "buffer.mask_void=false",
        "learner.lr=3e-3",
        "train.steps=3",
        "checkpoint.every=0",
    )
    records = read_metrics(train(recipe))
    assert [r["step"] for r in records] == [0, 1, 2]
    for step, r in enumerate(records):
        assert r["learner/batch_min_version"] == r["learner/batch_max_version"] == step
        assert r["perf/weight_sync_seconds"] > 0
    assert any(r["learner/grad_norm"] > 0 for r in records)  # the weights did change between pushes
