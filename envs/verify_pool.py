"""math-verify behind a hard wall-clock limit: persistent worker processes, killed and replaced on timeout.

sympy can spin for minutes on a pathological expression, and math-verify's own timeout
uses SIGALRM, which only works in a main thread. A rollout worker must never stall on a
reward, so each comparison goes to a worker process (envs/_verify_worker.py, started
with the same interpreter, talking JSON lines over pipes); a worker that misses the
deadline is killed, the comparison scores 0 and is counted as timed out, and a fresh
worker takes its place. Plain numbers and identical strings never leave this process.
"""

from __future__ import annotations

import asyncio
import json
import queue
import select
import subprocess
import sys
import threading
from pathlib import Path

from envs.rewards import Verdict, quick_verdict

_WORKER = Path(__file__).with_name("_verify_worker.py")
_START_TIMEOUT_S = 60.0  # importing sympy on a loaded 2-core machine


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.ready = False

    def readline(self, timeout_s: float) -> str | None:
        """One line from the worker, or None past the deadline or if it died."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return line or None

    def ask(self, pred: str, truth: str, timeout_s: float) -> bool | None:
        assert self.proc.stdin is not None
        if not self.ready:
            if self.readline(_START_TIMEOUT_S) != "ready\n":
                return None
            self.ready = True
        try:
            self.proc.stdin.write(json.dumps([pred, truth]) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self.readline(timeout_s)
        return None if line is None else line.strip() == "1"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class VerifyPool:
    """Up to `size` math-verify worker processes, started on demand; thread-safe, usable from any event loop."""

    def __init__(self, size: int = 2, timeout_s: float = 5.0):
        if size < 1:
            raise ValueError(f"VerifyPool size must be >= 1, got {size}")
        self.size, self.timeout_s = size, timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()
        self.timeouts = 0  # comparisons killed past the deadline (for metrics)

    def _acquire(self) -> _Worker:
        with self._lock:
            if self._idle.empty() and self._started < self.size:
                self._started += 1
                return _Worker()
        return self._idle.get()

    def verify_blocking(self, pred: str, truth: str, timeout_s: float | None = None) -> Verdict:
        quick = quick_verdict(pred, truth)
        if quick is not None:
            return Verdict(quick)
        worker = self._acquire()
        ok = worker.ask(pred, truth, self.timeout_s if timeout_s is None else timeout_s)
        if ok is not None:
            self._idle.put(worker)
            return Verdict(ok)
        worker.kill()
        self._idle.put(_Worker())
        with self._lock:
            self.timeouts += 1
        return Verdict(False, timed_out=True)

    async def verify(self, pred: str, truth: str, timeout_s: float | None = None) -> Verdict:
        quick = quick_verdict(pred, truth)
        if quick is not None:
            return Verdict(quick)
        return await asyncio.to_thread(self.verify_blocking, pred, truth, timeout_s)

    def close(self) -> None:
        """Kill the idle workers (call when no comparison is in flight)."""
        with self._lock:
            while not self._idle.empty():
                self._idle.get_nowait().kill()
            self._started = 0


_default: VerifyPool | None = None
_default_lock = threading.Lock()


def default_pool() -> VerifyPool:
    """The process-wide pool (two workers), created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = VerifyPool()
        return _default
