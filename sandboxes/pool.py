"""A pool of warm fork-server workers behind the `Sandbox` API (local, docker, unsafe-subprocess).

Each call takes an idle worker, runs, and gives it back; a worker is replaced after a
timeout, an OOM, a death, or `max_calls` calls. A session pins a process on one worker;
calls of other tasks keep using every worker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from sandboxes.api import ExecResult, Limits, Sandbox, SandboxError, Session, check_files
from sandboxes.worker import Worker, WorkerDied, WorkerHung

Launcher = Callable[[], Awaitable[Worker]]

_REFILL_DEADLINE_S = 120.0
_CALL_ATTEMPTS = 2  # a call whose worker dies under it runs once more on a fresh worker
_LOST_NOTE = "[sandbox] the session's previous state was lost (timeout, crash or OOM); this is a fresh one\n"


@dataclass
class PoolStats:
    """Counters for metrics endpoints and logs."""

    workers: int = 0
    calls: int = 0
    in_flight: int = 0
    timeouts: int = 0
    ooms: int = 0
    worker_deaths: int = 0
    recycled: int = 0
    sessions: int = 0
    retries: int = 0
    """Calls run again because their worker died under them."""
    launch_failures: int = 0
    """Replacement workers that failed to start (each is retried with backoff)."""
    hung: int = 0
    """Calls whose worker did not answer in time (raised as `WorkerHung`, a `SandboxError`)."""


class _Broken:
    """Queue item meaning 'the backend cannot start workers'; every waiter raises."""

    def __init__(self, error: BaseException):
        self.error = error


class PooledSandbox(Sandbox):
    def __init__(
        self,
        launcher: Launcher,
        *,
        pool_size: int = 1,
        limits: Limits | None = None,
        max_calls: int = 1000,
        name: str = "sandbox",
    ):
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        self.launcher = launcher
        self.pool_size = pool_size
        self.limits = limits or Limits()
        self.max_calls = max_calls
        self.name = name
        self.stats = PoolStats()
        self._idle: asyncio.Queue[Worker | _Broken] = asyncio.Queue()
        self._workers: set[Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """Start every worker now (otherwise the first call does it); raises if none can start."""
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise SandboxError(f"{self.name}: sandbox is closed")
            workers = await asyncio.gather(*(self._launch() for _ in range(self.pool_size)))
            for worker in workers:
                self._idle.put_nowait(worker)
            self._started = True

    async def _launch(self) -> Worker:
        worker = await self.launcher()
        self._workers.add(worker)
        self.stats.workers = len(self._workers)
        return worker

    async def _acquire(self) -> Worker:
        if not self._started:
            await self.start()
        while True:
            item = await self._idle.get()
            if isinstance(item, _Broken):
                self._idle.put_nowait(item)
                raise SandboxError(f"{self.name}: cannot start sandbox workers: {item.error}") from item.error
            if item.alive and not item.retiring:
                return item

    def _release(self, worker: Worker, recycle: bool) -> None:
        worker.calls += 1
        if not worker.alive:
            self.stats.worker_deaths += 1
            self._replace(worker)
        elif recycle or worker.calls >= self.max_calls:
            self.stats.recycled += 1
            self._replace(worker)
        else:
            self._idle.put_nowait(worker)

    def _replace(self, worker: Worker) -> None:
        """Retire `worker` (now, or when its last session closes) and start a fresh one."""
        worker.retiring = True
        if not worker.sessions:
            self._spawn(self._retire(worker))
        if not self._closed:
            self._spawn(self._refill())

    async def _retire(self, worker: Worker) -> None:
        self._workers.discard(worker)
        self.stats.workers = len(self._workers)
        await worker.kill()

    async def _refill(self) -> None:
        """Start a replacement worker, retrying with backoff for up to `_REFILL_DEADLINE_S` (a Docker engine
        being restarted); callers wait meanwhile. After that the pool is broken and every caller raises."""
        deadline = asyncio.get_running_loop().time() + _REFILL_DEADLINE_S
        for attempt in itertools.count():
            try:
                worker = await self._launch()
            except SandboxError as e:
                self.stats.launch_failures += 1
                if self._closed or asyncio.get_running_loop().time() > deadline:
                    self._idle.put_nowait(_Broken(e))
                    return
                await asyncio.sleep(min(0.1 * 2**attempt, 5.0))
            else:
                if self._closed:
                    await self._retire(worker)
                else:
                    self._idle.put_nowait(worker)
                return

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(
        self,
        code: str,
        *,
        limits: Limits | None = None,
        stdin: str | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        limits = limits or self.limits
        msg = {
            "op": "run",
            "code": code,
            "stdin": stdin,
            "files": {k: base64.b64encode(v).decode() for k, v in check_files(files).items()},
            "limits": limits.to_wire(),
        }
        for attempt in range(_CALL_ATTEMPTS):
            worker = await self._acquire()
            self.stats.in_flight += 1
            recycle = False
            try:
                async with worker.lock:
                    reply = await worker.request(msg, limits.timeout_s)
                recycle = reply["recycle"]
                result = ExecResult.from_wire(reply)
                break
            except WorkerHung:
                self.stats.hung += 1
                raise
            except WorkerDied as e:
                # Killed from outside (or by the code itself, where the sandbox lets it): run once more on a
                # fresh worker; if that one dies too, the code is the cause and the model sees it as a result.
                if attempt + 1 < _CALL_ATTEMPTS:
                    self.stats.retries += 1
                    continue
                result = ExecResult(
                    stdout="", stderr=f"[sandbox] {e}; the sandbox was replaced\n", exit_code=-9
                )
            finally:
                self.stats.in_flight -= 1
                self._release(worker, recycle)
        self.stats.calls += 1
        self.stats.timeouts += result.timed_out
        self.stats.ooms += result.oom_killed
        return result

    def session(self, *, limits: Limits | None = None) -> Session:
        return PooledSession(self, limits or self.limits)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(*(w.kill() for w in list(self._workers)), return_exceptions=True)
        self._workers.clear()
        self.stats.workers = 0


class PooledSession(Session):
    """A session process on one worker of the pool; reopened (with a note) if it is lost."""

    def __init__(self, pool: PooledSandbox, limits: Limits):
        self.pool = pool
        self.limits = limits
        self.worker: Worker | None = None
        self.sid: int | None = None
        self._lost = False

    async def _open(self) -> None:
        worker = await self.pool._acquire()
        try:
            async with worker.lock:
                reply = await worker.request({"op": "session_open", "limits": self.limits.to_wire()}, 10.0)
        finally:
            if worker.alive and not worker.retiring:
                self.pool._idle.put_nowait(worker)
        self.worker, self.sid = worker, reply["session"]
        worker.sessions.add(self.sid)
        self.pool.stats.sessions += 1

    def _forget(self) -> None:
        worker, sid = self.worker, self.sid
        self.worker = self.sid = None
        if worker is None or sid is None:
            return
        worker.sessions.discard(sid)
        self.pool.stats.sessions -= 1
        if worker.retiring and not worker.sessions:
            self.pool._spawn(self.pool._retire(worker))

    async def run(self, code: str, *, limits: Limits | None = None) -> ExecResult:
        limits = limits or self.limits
        if self.worker is None or not self.worker.alive:
            if self.worker is not None:
                self._forget()
                self._lost = True
            await self._open()
        assert self.worker is not None
        msg = {"op": "session_run", "session": self.sid, "code": code, "limits": limits.to_wire()}
        try:
            async with self.worker.lock:
                reply = await self.worker.request(msg, limits.timeout_s)
        except WorkerHung:
            self.pool.stats.hung += 1
            self.pool.stats.worker_deaths += 1
            self.pool._replace(self.worker)
            self._forget()
            self._lost = True
            raise
        except WorkerDied as e:
            self.pool.stats.worker_deaths += 1
            self.pool._replace(self.worker)
            self._forget()
            self._lost = True
            return ExecResult(stdout="", stderr=f"[sandbox] {e}; session state is lost\n", exit_code=-9)
        if reply["lost"]:
            self._forget()
            self._lost = True
            return await self.run(code, limits=limits)
        result = ExecResult.from_wire(reply)
        if self._lost:
            result = ExecResult.from_wire({**reply, "stderr": _LOST_NOTE + reply["stderr"]})
            self._lost = False
        if not reply["alive"]:
            self._forget()
            self._lost = True
        self.pool.stats.calls += 1
        self.pool.stats.timeouts += result.timed_out
        return result

    async def close(self) -> None:
        worker, sid = self.worker, self.sid
        if worker is None or sid is None:
            return
        if worker.alive:
            with contextlib.suppress(SandboxError):
                async with worker.lock:
                    await worker.request({"op": "session_close", "session": sid}, 10.0)
        self._forget()
