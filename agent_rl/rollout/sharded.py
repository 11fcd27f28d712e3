"""Rollouts over N processes: the episodes run in rollout processes (shard.py), the buffer stays in the driver.

    rollout:
      workers: 2      # N rollout processes on this machine; 1 (the default) runs episodes in the driver

What must be one stays in the driver: the buffer (groups, staleness bound, admission), the prompt cursor,
the engine clients and the weights. The driver admits prompts exactly as the in-process workers do and
hands each episode to the process running the fewest (at most rollout.max_concurrent_episodes in all).
A process makes its own envs, tokenizer, sandbox and agent gateway, samples through the driver's engine
client (so weight pushes, aborts and versions work unchanged) and sends each trajectory's changes back
whenever the episode waits, so the driver's copy, which the staleness bound, batches and checkpoints
read, is what an in-process buffer would hold. A group over the bound is announced to the processes
running its episodes, which abandon them. Same interface as `workers.Rollouts` (start on the loop,
stop, stats, counters, last_error).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import RolloutConfig
from agent_rl.engines.api import EngineClient, EngineError
from agent_rl.rollout import shard
from agent_rl.rollout.episodes import BusyClock, RolloutCounters
from agent_rl.rollout.shard import Answer, Done, EngineCall, Link, RunEpisode, Update, WorkerEnv
from agent_rl.rollout.workers import PromptSource, Rates
from agent_rl.types import Trajectory

__all__ = ["ShardedRollouts", "WorkerEnv"]
START_TIMEOUT_S = 600.0  # a process that has not connected by then (importing, loading the tokenizer) failed


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen
    link: Link | None = None
    running: int = 0
    counters: RolloutCounters = field(default_factory=RolloutCounters)
    last_error: str | None = None


class ShardedRollouts:
    def __init__(
        self,
        cfg: RolloutConfig,
        buffer: RolloutBuffer,
        prompts: PromptSource,
        env: WorkerEnv,
        engine: EngineClient,
        *,
        max_seq_len: int,
        seed: int,
    ):
        self.cfg, self.buffer, self.prompts, self.env, self.engine = cfg, buffer, prompts, env, engine
        self.max_seq_len, self.seed = max_seq_len, seed
        self.busy, self.rates = BusyClock(), Rates()
        self.workers: list[_Worker] = []
        self._trajs: dict[str, Trajectory] = {}  # the buffer's copies of the trajectories in flight
        self._owner: dict[str, _Worker] = {}  # member uid -> the process running it
        self._queue: deque[RunEpisode] = deque()
        self._doomed: set[str] = set()  # groups announced over the bound
        self._tasks: set[asyncio.Task] = set()
        self._dir: str | None = None
        self._stopping = False

    @property
    def counters(self) -> RolloutCounters:
        total = sum((w.counters for w in self.workers), RolloutCounters())
        total.engine_busy_seconds = self.busy.total()
        return total

    @property
    def last_error(self) -> str | None:
        return next((w.last_error for w in self.workers if w.last_error), None)

    def stats(self) -> dict[str, float]:
        active = {"rollout/processes_with_episodes": sum(1 for w in self.workers if w.counters.episodes)}
        return self.rates.stats(self.counters, self.busy.total()) | active

    # -- lifecycle (call on the loop) ---------------------------------------------------------
    def start(self) -> None:
        self._spawn(self._run())

    def stopping(self) -> None:
        """The run is ending (the engines close next, then `stop` cancels the processes' episodes): a process's
        lost connection or failure from here on is the shutdown's, not an error of the run."""
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
        for w in self.workers:
            if w.link is not None:
                with contextlib.suppress(Exception):
                    w.link.send(None)  # stop: the process cancels its episodes, closes its sandbox, exits
        tasks = list(self._tasks)  # the producer (or a start still connecting: its server closes), readers
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(_reap, [w.proc for w in self.workers])
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _run(self) -> None:
        await self._connect()
        for g in self.buffer.open_groups():  # a restored checkpoint's in-flight work goes first
            for i, member in enumerate(g.members):
                if i not in g.reported:
                    if member is not None:
                        self._trajs[member.uid] = member
                    restored = None if member is None else member.to_bytes()
                    self._queue.append(RunEpisode(g.group_id, self.prompts.tasks[g.task_id], i, restored))
            for f in g.forks:
                self._trajs[f.uid] = f
        self._dispatch()
        self._spawn(self._watch())
        while True:  # the producer: admission as in workers.Rollouts
            group_id = await self.buffer.admit(lambda: self.prompts.next_id(self.buffer.recycled))
            task = self.prompts.tasks[self.buffer.open_task(group_id)]
            self._queue.extend(RunEpisode(group_id, task, i, None) for i in range(self.buffer.group_size))
            self._dispatch()

    async def _connect(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="agent-rl-rollout-")
        path = os.path.join(self._dir, "driver.sock")
        arrived: asyncio.Queue = asyncio.Queue()
        server = await asyncio.start_unix_server(lambda r, w: arrived.put_nowait(Link(r, w)), path)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *(p for p in sys.path if p)])}
        for _ in range(self.cfg.workers):
            cmd = [sys.executable, "-m", "agent_rl.rollout.shard", path]
            self.workers.append(_Worker(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)))
        by_pid = {w.proc.pid: w for w in self.workers}
        setup = shard.Setup(self.cfg, self.env, self.max_seq_len, self.seed)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        try:
            while any(w.link is None for w in self.workers):
                try:
                    link = await asyncio.wait_for(arrived.get(), 0.5)
                except TimeoutError:
                    dead = [w.proc for w in self.workers if w.link is None and w.proc.poll() is not None]
                    if dead or loop.time() > deadline:
                        why = (
                            f"exited with code {dead[0].returncode}"
                            if dead
                            else f"did not connect in {START_TIMEOUT_S:g} s"
                        )
                        raise RuntimeError(
                            f"rollout process {(dead or [self.workers[0].proc])[0].pid} {why} (rollout.workers="
                            f"{self.cfg.workers}); its error is above on stderr"
                        ) from None
                    continue
                link.send(setup)
                try:
                    worker = by_pid[(await link.recv())[0]]
                except (asyncio.IncompleteReadError, ConnectionError):
                    raise RuntimeError(
                        f"a rollout process failed during its setup (rollout.workers={self.cfg.workers}); "
                        "its error is above on stderr"
                    ) from None
                worker.link = link
                self._spawn(self._read(worker))
        finally:
            server.close()

    # -- episodes out -----------------------------------------------------------------------
    def _dispatch(self) -> None:
        while self._queue and sum(w.running for w in self.workers) < self.cfg.max_concurrent_episodes:
            msg = self._queue.popleft()
            w = min(self.workers, key=lambda w: w.running)
            w.running += 1
            self._owner[f"{msg.group_id}/{msg.index}"] = w
            assert w.link is not None
            w.link.send(msg)

    def _check_doom(self, group_id: str) -> None:
        """Announce a group over the bound to the processes running its episodes (they abandon them)."""
        if group_id in self._doomed or not self.buffer.doomed(group_id):
            return
        self._doomed.add(group_id)
        prefix = group_id + "/"
        for w in {w for uid, w in self._owner.items() if uid.startswith(prefix)}:
            assert w.link is not None
            w.link.send(shard.Doom(group_id))

    async def _watch(self) -> None:
        """A new version or bound can put running groups over it: check them when either changes."""
        seen = None
        while True:
            await self.buffer.changed()
            if (self.buffer.version, self.buffer.k) != seen:
                seen = (self.buffer.version, self.buffer.k)
                for gid in {uid.rsplit("/", 1)[0] for uid in self._owner}:
                    self._check_doom(gid)

    # -- what the processes send ------------------------------------------------------------
    async def _read(self, w: _Worker) -> None:
        assert w.link is not None
        while True:
            try:
                msgs = await w.link.recv()
            except (asyncio.IncompleteReadError, ConnectionError):
                if self._stopping:
                    return
                code = await asyncio.to_thread(w.proc.wait)
                raise RuntimeError(
                    f"rollout process {w.proc.pid} exited with code {code} mid-run; its error is above on stderr"
                ) from None
            for msg in msgs:
                self._handle(w, msg)

    def _handle(self, w: _Worker, msg: Any) -> None:
        if isinstance(msg, EngineCall):
            self._spawn(self._serve(w, msg))
        elif isinstance(msg, Update):
            self._apply(msg)
        elif isinstance(msg, Done):
            self._done(w, msg)
        elif isinstance(msg, shard.Fork):
            fork = self.buffer.fork(self._trajs[msg.member_uid], msg.n)
            self._trajs[fork.uid] = fork
        elif isinstance(msg, shard.DropForks):
            if msg.member_uid in self._trajs:  # else not started here yet: it has no forks
                self.buffer.drop_forks(self._trajs[msg.member_uid])
            for uid in [u for u in self._trajs if u.startswith(msg.member_uid + ".")]:
                del self._trajs[uid]
        elif isinstance(msg, shard.Failed) and not self._stopping:
            raise RuntimeError(msg.message)

    def _apply(self, u: Update) -> None:
        traj = self._trajs.get(u.uid)
        if traj is None:  # the member's first report: it starts now
            group_id, index = u.uid.rsplit("/", 1)
            traj = self._trajs[u.uid] = self.buffer.start(group_id, int(index), u.prompt_ids or [])
        if u.prompt_ids is not None:
            traj.prompt_ids = list(u.prompt_ids)
        first = not any(seg.sampled for seg in traj.segments[: u.from_segment])
        del traj.segments[u.from_segment :]
        traj.segments.extend(u.segments)
        del traj.turns[u.from_turn :]
        traj.turns.extend(u.turns)
        traj.extras, traj.reward, traj.masked = u.extras, u.reward, u.masked
        traj.finish_reason, traj.infra_cause = u.finish_reason, u.infra_cause
        if u.routed_experts is not None:
            traj.routed_experts = u.routed_experts
        if first and any(seg.sampled for seg in u.segments):  # its oldest version: the group may now be over
            self._check_doom(traj.group_id)

    def _done(self, w: _Worker, d: Done) -> None:
        traj = self._trajs.pop(d.uid)
        for uid in [u for u in self._trajs if u.startswith(d.uid + ".")]:  # its forks: the buffer holds them
            del self._trajs[uid]
        del self._owner[d.uid]
        w.running -= 1
        w.counters, w.last_error = d.counters, d.last_error or w.last_error
        (self.buffer.finish if d.finished else self.buffer.abandon)(traj)
        if self.cfg.max_errors is not None and self.counters.errors > self.cfg.max_errors:
            self.buffer.fail(
                RuntimeError(f"{self.counters.errors} episodes failed; last error: {self.last_error}")
            )
        if not d.finished:  # abandoned: its group is doomed, the other members stop too
            self._check_doom(traj.group_id)
        self._dispatch()

    async def _serve(self, w: _Worker, call: EngineCall) -> None:
        """Answer a process's engine call with the driver's engine client."""
        assert w.link is not None
        try:
            if call.method == "generate":
                self.busy.enter()
                try:
                    value = await self.engine.generate(*call.args, **call.kwargs)
                finally:
                    self.busy.leave()
            else:
                value = await self.engine.health()
            w.link.send(Answer(call.rid, value))
        except Exception as e:
            w.link.send(Answer(call.rid, None, _portable(e)))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._check_crash)

    def _check_crash(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._stopping:
            self.buffer.fail(task.exception())  # a bug or a lost process: stop the run loudly


def _portable(e: Exception) -> Exception:
    """`e` if it survives pickling (BadRequest, EngineUnavailable, ...), else an EngineError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return EngineError(repr(e))


def _reap(procs: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
