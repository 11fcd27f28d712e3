"""Rollout workers: asyncio episodes between engines and environments, feeding the buffer.

One task per episode (episodes.py runs it), many in flight. The workers run on their own event loop
in a background thread, so the learner's torch step in the main thread overlaps with sampling;
`rollout.workers: N > 1` spreads the episodes over N processes instead (sharded.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import RolloutConfig
from agent_rl.engines.api import EngineClient
from agent_rl.rollout.episodes import EpisodeEnv, EpisodeRunner, RolloutCounters
from agent_rl.rollout.episodes import _seed as _seed  # noqa: F401 - the request seed (tests replay it)
from agent_rl.types import Trajectory


class PromptSource:
    """The training prompts in a seeded order, epoch after epoch; recycled prompts come first.

    Its cursor (epoch, index) is part of every checkpoint, so a resumed run uses each prompt
    exactly as often as an uninterrupted one.
    """

    def __init__(self, tasks: Iterable[Any], *, seed: int):
        self.tasks = {t.id: t for t in tasks}
        if not self.tasks:
            raise ValueError("the training split has no tasks")
        self.seed = seed
        self.epoch, self.index = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[str]:
        ids = sorted(self.tasks)
        random.Random(f"{self.seed}:{epoch}").shuffle(ids)
        return ids

    def next_id(self, recycled: deque[str]) -> str:
        if recycled:
            return recycled.popleft()
        if self.index == len(self._order):
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        self.index += 1
        return self._order[self.index - 1]

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._shuffled(self.epoch)


class Rollouts:
    """Runs episodes continuously on a background event loop, in this process, until stopped."""

    def __init__(
        self,
        cfg: RolloutConfig,
        buffer: RolloutBuffer,
        prompts: PromptSource,
        make_env: Callable[[], EpisodeEnv],
        engine: EngineClient,
        *,
        max_seq_len: int,
        seed: int,
    ):
        self.cfg, self.buffer, self.prompts = cfg, buffer, prompts
        self.runner = EpisodeRunner(cfg, buffer, make_env, engine, max_seq_len=max_seq_len, seed=seed)
        self.rates = Rates()
        self._slots = asyncio.Semaphore(cfg.max_concurrent_episodes)
        self._tasks: set[asyncio.Task] = set()
        self._producer: asyncio.Task | None = None

    @property
    def counters(self) -> RolloutCounters:
        return self.runner.counters

    @property
    def last_error(self) -> str | None:
        return self.runner.last_error

    # -- lifecycle (call on the loop) ---------------------------------------------------
    def start(self) -> None:
        """Resume the buffer's open groups (a restored checkpoint's in-flight work), then admit new prompts."""
        for g in self.buffer.open_groups():
            for i, member in enumerate(g.members):
                if i not in g.reported:
                    self._spawn(self._episode(g.group_id, g.task_id, i, member))
        self._producer = asyncio.create_task(self._produce())
        self._producer.add_done_callback(self._check_crash)

    def stopping(self) -> None:
        """The run is ending: episodes that fail from here on (the engines close first) end as cancelled."""
        self.runner.stopping = True

    async def stop(self) -> None:
        tasks = [t for t in [self._producer, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.runner.close()

    async def _produce(self) -> None:
        while True:
            group_id = await self.buffer.admit(lambda: self.prompts.next_id(self.buffer.recycled))
            task_id = self.buffer.open_task(group_id)
            for i in range(self.buffer.group_size):
                self._spawn(self._episode(group_id, task_id, i, None))

    async def _episode(self, group_id: str, task_id: str, index: int, traj: Trajectory | None) -> None:
        async with self._slots:
            await self.runner.run(group_id, self.prompts.tasks[task_id], index, traj)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._check_crash)

    def _check_crash(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.buffer.fail(task.exception())  # a bug, not an infrastructure error: stop the run loudly

    def stats(self) -> dict[str, float]:
        """Counters since the previous call, as rates and means (call once per training step)."""
        return self.rates.stats(self.runner.counters, self.runner.busy.total())


class Rates:
    """Rollout counters as per-step rates and means: each `stats` covers the time since the previous one."""

    def __init__(self) -> None:
        self._snap = (time.monotonic(), RolloutCounters())

    def stats(self, c: RolloutCounters, busy: float) -> dict[str, float]:
        now = time.monotonic()
        t_prev, p = self._snap
        dt = max(now - t_prev, 1e-9)
        d = {k: v - getattr(p, k) for k, v in vars(c).items()}
        self._snap = (now, RolloutCounters(**{**vars(c), "engine_busy_seconds": busy}))
        eps, turns, calls = d["episodes"], d["turns"], d["tool_calls"]
        # Means over what ended in the interval; an interval where nothing ended (a skipped step's instant) has no
        # mean, so none is written (not a 0 that a curve would read as "the policy stopped using its tool").
        return (
            {
                "perf/rollout_tokens_per_s": d["sampled_tokens"] / dt,
                "perf/engine_busy_fraction": min(1.0, (busy - p.engine_busy_seconds) / dt),
                "rollout/episodes": c.episodes,
                "rollout/aborts": c.aborts,
                "rollout/aborted_turn_seconds": d["aborted_turn_seconds"],
                "rollout/engine_retries": c.engine_retries,
                "rollout/errors": c.errors,
                "rollout/abandoned": c.abandoned,
                # cumulative: episodes left out of their groups as infrastructure failures, by cause; retries
                "rollout/infra_failed": c.errors,
                "rollout/infra_retries": c.infra_retries,
                **{f"rollout/infra_failed/{cause}": n for cause, n in sorted(c.infra_failed.items())},
            }
            | (
                {
                    "rollout/turns_per_episode": turns / eps,
                    "rollout/tool_calls_per_episode": calls / eps,
                    "rollout/episode_seconds": d["episode_seconds"] / eps,
                }
                if eps
                else {}
            )
            | (
                {
                    "rollout/gen_seconds_per_turn": d["gen_seconds"] / turns,
                    "rollout/tool_seconds_per_turn": d["tool_seconds"] / turns,
                }
                if turns
                else {}
            )
            | ({"rollout/tool_error_rate": d["tool_errors"] / calls} if calls else {})
            | (
                {
                    "rollout/agent_splits": c.agent_splits,  # cumulative; 0 when every agent only appends
                    "rollout/agent_rerendered_share": d["agent_rerendered"] / max(d["agent_calls"], 1),
                    "rollout/agent_errors": c.agent_errors,
                    # cumulative; 0 with the embedded engine (it reports unmasked log-probs), > 0 with SGLang/vLLM
                    "rollout/constrained_masked_fallback_tokens": c.constrained_masked_fallback_tokens,
                }
                | ({"rollout/agent_calls_per_episode": d["agent_calls"] / eps} if eps else {})
                if c.agent_calls
                else {}
            )
        )
