"""Rollouts sharded over rollout processes (rollout.workers: N): the episodes run in the processes with the real
env and sandbox, the buffer and the staleness bound stay in the driver.

The first tests drive `ShardedRollouts` against a FakeEngine (scripted tokens at the EngineClient boundary, in
the driver; the processes reach it through the driver as they would a real engine); the last ones train the
smoke recipe with the real engine: end to end, and at k=0 the same update as the in-process workers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from loop_paths import DENSE_ENV, ROOT
from parity import assert_same_step, recorded_step
from transformers import AutoTokenizer

import envs
from agent_rl.buffer import BufferClosed, RolloutBuffer
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.engines.api import Generation, SamplingParams
from agent_rl.metrics import read_metrics
from agent_rl.rollout.sharded import ShardedRollouts, WorkerEnv
from agent_rl.rollout.workers import PromptSource
from agent_rl.trainer import train

CODE = "```python\nprint(6 * 7)\n```\n"
ANSWER = "so \\boxed{42}"


@dataclass
class FakeEngine:
    """A code turn, then (once the input holds a tool result) an answer turn, at `version` (a continuation gets
    the rest of the turn); optionally aborts the first request after `abort_first_after` tokens and bumps the
    version, or holds group `hold`'s second turns until `release` is set (and signals `held`)."""

    code: list[int]
    answer: list[int]
    marker: int  # a token of the observation template: the input holds a tool result
    version: int = 0
    abort_first_after: int | None = None
    hold: str | None = None
    held: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[str] = field(default_factory=list)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        self.calls.append(request_id)
        second = self.marker in input_ids
        if self.hold is not None and second and request_id.startswith(self.hold + "/"):
            self.held.set()
            await self.release.wait()
        if self.abort_first_after is not None:
            n, self.abort_first_after = self.abort_first_after, None
            out = Generation(self.code[:n], [-1.0] * n, [self.version] * n, "abort")
            self.version += 1
            return out
        done = int(request_id.rsplit(".", 1)[1])  # tokens of this turn already sampled (a continuation)
        ids = (self.answer if second else self.code)[done : done + sampling.max_new_tokens]
        return Generation(list(ids), [-0.5] * len(ids), [self.version] * len(ids), "stop")

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def update_weights(self, *, version: int, path=None, tensors=None) -> None: ...
    async def health(self) -> bool:
        return True

    async def close(self) -> None: ...


def _setup(tiny_model_dir: Path, k: int, **engine_kw) -> tuple[ShardedRollouts, FakeEngine]:
    spec = envs.load(ROOT / "envs" / "tiny_arith.yaml")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    engine = FakeEngine(enc(CODE), enc(ANSWER), enc("```output")[-1], **engine_kw)  # "output"
    buffer = RolloutBuffer(BufferConfig(max_staleness=k), batch_prompts=2, group_size=spec.group_size)
    prompts = PromptSource(envs.make(spec, tok).tasks("train"), seed=0)
    cfg = RolloutConfig(workers=2, max_concurrent_episodes=16)
    return ShardedRollouts(
        cfg, buffer, prompts, WorkerEnv(spec, tok), engine, max_seq_len=256, seed=0
    ), engine


async def test_sharded_rollouts_run_each_episode_in_a_rollout_process_and_deliver_whole_groups(
    tiny_model_dir: Path,
) -> None:
    r, engine = _setup(tiny_model_dir, k=1)
    r.start()
    try:
        batches = [await asyncio.wait_for(r.buffer.take(2), 120) for _ in range(2)]
    finally:
        await r.stop()
    for group in (g for batch in batches for g in batch):
        assert len(group.trajectories) == 8
        for t in group.trajectories:  # two turns: the code ran in the process's sandbox, then the answer
            sampled = [s.token_ids for s in t.segments if s.sampled]
            assert sampled == [tuple(engine.code), tuple(engine.answer)]
            assert t.turns[0].code_ran and t.turns[0].exit_code == 0 and t.reward in (0.0, 1.0)
            assert t.flatten().versions.count(0) == len(engine.code) + len(engine.answer)
    pids = {w.proc.pid for w in r.workers}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(w.counters.episodes > 0 for w in r.workers), "both processes ran episodes"
    assert r.counters.episodes >= 32 and r.stats()["rollout/processes_with_episodes"] == 2


async def test_an_aborted_turn_continues_in_the_rollout_process_and_keeps_each_token_version(
    tiny_model_dir: Path,
) -> None:
    r, engine = _setup(tiny_model_dir, k=4, abort_first_after=3)
    r.start()
    trajs: list = []
    try:
        for _ in range(20):  # until the interrupted episode's group is delivered
            trajs += [t for g in await asyncio.wait_for(r.buffer.take(2), 120) for t in g.trajectories]
            if any(t.min_version != t.max_version for t in trajs):
                break
    finally:
        await r.stop()
    spanning = [t for t in trajs if t.min_version != t.max_version]
    assert len(spanning) == 1 and r.counters.aborts == 1
    (t,) = spanning
    first = [s for s in t.segments if s.sampled][
        :2
    ]  # the aborted request's 3 tokens, then the continuation's
    assert first[0].versions == (0, 0, 0) and set(first[1].versions) == {1}
    assert first[0].token_ids + first[1].token_ids == tuple(engine.code)


async def test_a_group_over_the_bound_is_abandoned_by_the_processes_and_its_prompt_sampled_again(
    tiny_model_dir: Path,
) -> None:
    r, engine = _setup(tiny_model_dir, k=0, hold="g0")
    r.start()
    try:
        await asyncio.wait_for(engine.held.wait(), 120)  # g0 sampled its first turn at version 0, waits
        engine.version = 1
        r.buffer.set_version(1)  # the learner stepped: g0 (version-0 tokens) is now over the bound k=0
        engine.release.set()
        batch = await asyncio.wait_for(r.buffer.take(2), 120)
    finally:
        await r.stop()
    assert r.buffer.counters.dropped_stale >= 1 and r.buffer.counters.recycled >= 1
    assert r.counters.abandoned >= 1, "the processes stopped the doomed episodes"
    assert all(t.min_version == 1 for g in batch for t in g.trajectories), "k=0: only version-1 tokens"


async def test_a_rollout_process_that_dies_stops_the_run_naming_its_exit_code(tiny_model_dir: Path) -> None:
    r, _ = _setup(tiny_model_dir, k=1)
    r.start()
    try:
        await asyncio.wait_for(r.buffer.take(1), 120)
        os.kill(r.workers[0].proc.pid, signal.SIGKILL)
        with pytest.raises(BufferClosed, match="exited with code -9"):
            for _ in range(1000):
                await asyncio.wait_for(r.buffer.take(1), 120)
    finally:
        await r.stop()


def test_the_smoke_recipe_trains_end_to_end_with_two_rollout_processes(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "rollout.workers=2", "buffer.max_staleness=2", "train.steps=3", "checkpoint.every=0"
    )
    records = read_metrics(train(recipe))
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["buffer/staleness_max"] <= 2 and 0 < r["vcpo/ess_ratio"] <= 1 + 1e-9
    assert records[-1]["rollout/processes_with_episodes"] == 2
    assert records[-1]["learner/version"] == 3


def test_k0_with_two_rollout_processes_trains_on_what_in_process_workers_make(smoke_recipe, tmp_path) -> None:
    runs = {}
    for workers in (1, 2):
        recipe = smoke_recipe(
            f"envs.train={DENSE_ENV}",  # rewards that differ within a group, so the advantages are not all 0
            "buffer.max_staleness=0",
            "train.steps=1",
            "checkpoint.every=0",
            "logging.trajectories=all",  # every trained trajectory with the learner's log-probs and coefficients
            f"rollout.workers={workers}",
            f"logging.run_dir={tmp_path / f'w{workers}'}",
        )
        runs[workers] = Path(train(recipe))
    one, two = ([json.loads(x) for x in (runs[w] / "batches.jsonl").read_text().splitlines()] for w in (1, 2))
    assert one == two, "the same prompts, trajectories, sampled token counts and versions"
    a, b = (recorded_step(runs[w], 0) for w in (1, 2))
    assert any(abs(x.advantage) > 0.05 for x in a.values()), "a step with every advantage 0 proves nothing"
    assert_same_step(
        a, b
    )  # tests/loop/parity.py: the batch, and the learner's coefficients, not weights after Adam
