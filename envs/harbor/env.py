"""One episode of a Harbor task with the built-in agent: the model works in the task's container.

The built-in agent is SimpleTIR's loop with a shell for its tool: each turn's first fenced ```bash block runs
in the episode's own container (a fresh one from the warm pool, started at the first command), its output
comes back as the observation, and a file is edited the way a shell edits it (`cat > f <<'EOF'`, sed,
patch). A turn without a block ends the episode; then the task's tests are copied in and test.sh gives the
reward (verify.py). The task's agent timeout bounds the commands' total time. A container that cannot
start or dies, and a verifier that times out or writes no reward, raise InfraFailure: the rollout retries
the episode and then leaves it out of its group, never scoring it 0.

    env:   {name: swe_tiny, type: harbor, harbor: {tasks: envs/harbor_tasks/swe_tiny, heldout_fraction: 0.2}}
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from envs.codec import codec
from envs.datasets import DatasetReport
from envs.harbor.image import ensure_base, start_container
from envs.harbor.task import HarborTask, heldout, load_tasks
from envs.harbor.verify import run_verifier
from envs.loop_resources import loop_resources
from envs.spec import EnvSpec
from envs.tir import ObservationFormatter
from envs.turns import TurnBudget
from envs.types import EnvError, Finish, InfraFailure, StepInfo, StepResult, Task
from sandboxes.api import SandboxError

T = TypeVar("T")
_BASH_RE = re.compile(r"(?:^|\n)[ \t]*```(?:bash|sh|shell)[ \t]*\n(.*?)\n?[ \t]*```", re.S)

SYSTEM = (
    "You are working in a Linux container with a shell. To run a command, write it in a fenced block:\n"
    "```bash\nls /app\n```\nIts output is shown to you. Edit files with shell commands. "
    "When the task is done, reply without a command block."
)


def bash_block(text: str) -> str | None:
    m = _BASH_RE.search(text)
    return m.group(1) if m else None


@dataclass
class _Suite:
    tasks: dict[str, HarborTask]
    splits: dict[str, tuple[Task, ...]]
    prompts: dict[str, list[int]] = field(default_factory=dict)


_SUITES: dict[tuple[int, int], _Suite] = {}


def _suite(spec: EnvSpec, tokenizer: Any) -> _Suite:
    key = (id(spec), id(tokenizer))
    if key not in _SUITES:
        assert spec.harbor is not None
        tasks = {t.name: t for t in load_tasks(spec.harbor.resolved_tasks(spec.source_path))}
        frac = spec.harbor.heldout_fraction
        split = {
            "train": tuple(
                Task(n, t.instruction, "", source=str(t.path))
                for n, t in tasks.items()
                if not heldout(n, frac)
            ),
            "test": tuple(
                Task(n, t.instruction, "", source=str(t.path)) for n, t in tasks.items() if heldout(n, frac)
            ),
        }
        _SUITES[key] = _Suite(tasks, split)
    return _SUITES[key]


DOCKER_THREADS = 64
"""Threads for the episodes' blocking Docker calls on one event loop (a container's start, a command, the verifier).
Each in-flight episode waits on at most one such call, and a thread waiting on Docker's socket costs no CPU, so
this is sized above any rollout.max_concurrent_episodes we run. The loop's default executor (asyncio.to_thread) has
min(32, cores + 4) threads, 6 on two cores: 32 episodes queued their commands and verifiers behind 6 pytest runs,
and whatever else the loop ran in it (an engine's close) waited behind them too."""


def loop_pool(spec: EnvSpec) -> _LoopPool:
    """This event loop's container pool for the spec's Docker engine (the base image built once) and its threads
    (public: benchmarks/trl_swe.py runs TRL's tool calls and verifiers in the same pool)."""
    from sandboxes.task_containers import ContainerPool

    assert spec.harbor is not None
    h = spec.harbor
    per_loop = loop_resources()
    key = f"harbor-pool:{h.docker_host}"
    if key not in per_loop:
        pool = ContainerPool(
            h.docker_host, run=f"harbor-{id(per_loop)}", pool="harbor", warm=h.warm_containers
        )
        ensure_base(pool)
        parallel = h.parallel_commands or 2 * (os.cpu_count() or 1)
        threads = ThreadPoolExecutor(DOCKER_THREADS, thread_name_prefix="harbor-docker")
        per_loop[key] = _LoopPool(pool, threads, asyncio.Semaphore(parallel))
    return per_loop[key]


@dataclass
class _LoopPool:
    """The pool as a loop resource (close_shared_sandboxes awaits `close()`) with the threads its calls block in."""

    pool: Any
    threads: ThreadPoolExecutor
    commands: asyncio.Semaphore
    """Bounds the CPU work in containers (commands, verifiers) at once: harbor.parallel_commands."""
    closed: bool = False

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in one of the pool's threads (a blocking Docker call), awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.threads, partial(fn, *args, **kwargs))

    async def work(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """As `call`, for a command or a verifier: waits for one of the `commands` slots first."""
        async with self.commands:
            return await self.call(fn, *args, **kwargs)

    async def release(self, c: Any) -> None:
        """An episode's container goes; after `close` (the pool removed it already) there is nothing to do."""
        if not self.closed:
            await self.call(self.pool.release, c)

    async def close(self) -> None:
        """Drop the calls not started yet, then remove every container: a call blocked in one (a command, a
        verifier) returns at once instead of running to its time limit, so shutdown waits for nothing."""
        self.closed = True
        self.threads.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.pool.close)


class HarborEnv(TurnBudget):
    def __init__(self, spec: EnvSpec, tokenizer: Any):
        assert spec.harbor is not None
        self.spec = spec
        self._tok = tokenizer
        self._codec = codec(tokenizer)
        obs = spec.tool.observation
        self._fmt = ObservationFormatter(tokenizer, obs.template, obs.max_tokens)
        self._suite = _suite(spec, tokenizer)
        self._task: HarborTask | None = None
        self._container: Any = None
        self._lp: _LoopPool | None = None  # the pool the container came from (its threads release it)
        self._texts: list[str] = []
        self._turns = self._used = 0
        self._tool_s = 0.0
        self._done = False

    def tasks(self, split: str) -> tuple[Task, ...]:
        if split not in self._suite.splits:
            raise EnvError(f"env {self.spec.name}: unknown split {split!r} (train or test)")
        return self._suite.splits[split]

    def data_report(self, split: str) -> DatasetReport:
        return DatasetReport(
            source=str(self.spec.harbor.tasks), rows=len(self.tasks(split)), tasks=len(self.tasks(split))
        )  # type: ignore[union-attr]

    def reset(self, task: Task) -> list[int]:
        if self._container is not None:
            raise EnvError("reset() during an episode with a container; await env.close() or make a new env")
        self._task = self._suite.tasks[task.id]
        self._texts, self._turns, self._used, self._tool_s, self._done = [], 0, 0, 0.0, False
        ids = self._suite.prompts.get(task.id)
        if ids is None:
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": self._task.instruction},
            ]
            text = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = self._suite.prompts[task.id] = self._codec.encode(text)
        return list(ids)

    async def step(self, sampled_ids: list[int], *, truncated: bool = False) -> StepResult:
        if self._task is None or self._done:
            raise EnvError("step() before reset() or after the episode ended; make a new env per episode")
        self._turns += 1
        self._used += len(sampled_ids)
        text = self._codec.decode(sampled_ids, skip_special_tokens=True)
        self._texts.append(text)
        command = bash_block(text)
        t = self.spec.turns
        if command is None:
            return await self._finish("length" if truncated else "answer")
        if self._turns >= t.max_turns:
            return await self._finish("max_turns")
        return await self._run(command)

    async def _run(self, command: str) -> StepResult:
        task = self._task
        assert task is not None
        if self._container is None:
            self._container = await self._start(task)
        left = (task.agent_timeout_s or self.spec.harbor.command_timeout_s) - self._tool_s  # type: ignore[union-attr]
        limit = max(1.0, min(self.spec.harbor.command_timeout_s, left))  # type: ignore[union-attr]
        start = time.perf_counter()
        try:
            res = await self._work(self._container.exec, command, timeout_s=limit)
        except SandboxError as e:
            raise InfraFailure("sandbox_killed", f"task {task.name}: {e}") from e
        seconds = time.perf_counter() - start
        self._tool_s += seconds
        shown = res.stdout + res.stderr
        if res.timed_out:
            shown += f"\n(the command ran past {limit:g} s and was stopped)"
        elif res.exit_code:
            shown += f"\n(exit status {res.exit_code})"
        ids = self._fmt.encode(shown.strip() or self.spec.tool.observation.empty)
        ran = dict(code_ran=True, exit_code=res.exit_code, timed_out=res.timed_out, tool_seconds=seconds)
        if self._used + len(ids) >= self.spec.turns.max_response_tokens:
            return await self._finish("length", **ran)
        self._used += len(ids)
        return StepResult(ids, None, False, StepInfo(**ran))

    async def _finish(self, finish: Finish, **ran: Any) -> StepResult:
        self._done = True
        task = self._task
        assert task is not None
        try:
            if self._container is None:  # no command ran: the tests judge the untouched repository
                self._container = await self._start(task)
            reward = await self._work(run_verifier, task, self._container)
        finally:
            await self.close()
        return StepResult([], reward, True, StepInfo(finish=finish, **ran))

    async def _start(self, task: HarborTask) -> Any:
        self._lp = loop_pool(self.spec)
        allow = self.spec.harbor.allow_network  # type: ignore[union-attr]
        return await self._call(start_container, task, self._lp.pool, allow_network=allow)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        assert self._lp is not None
        return await self._lp.call(fn, *args, **kwargs)

    async def _work(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        assert self._lp is not None
        return await self._lp.work(fn, *args, **kwargs)

    async def close(self) -> None:
        """Give the episode's container back (removed, never reused)."""
        if self._container is not None:
            c, self._container = self._container, None
            assert self._lp is not None
            await self._lp.release(c)
