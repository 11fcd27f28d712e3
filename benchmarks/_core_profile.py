"""Where a run's CPU time goes: per-thread CPU seconds of a process tree, grouped by the role that owns each
thread, sampled from /proc while the run goes (benchmarks/vs_trl.py's profile).

Linux only (it reads /proc/PID/task/TID/stat, fields utime and stime, in clock ticks). A thread's role comes
from its process and its name:
- the TRL process (`trl_run.py`): "trl" (its phases are split by wall and process-CPU time in trl_run.py);
- agent-rl's processes topology: the embedded engine server ("engine"), a learner rank's spawned process
  ("learner"), the driver (the `agent-rl train` process: "driver");
- the in-process topology, by thread name (agent-rl names its threads natively, agent_rl/thread_names.py):
  "agent-rl-engine" -> engine, "rollouts" -> driver, the rest of the process (the main thread runs the
  learner and the trainer loop; torch's worker threads inherit their creator's name) -> learner;
- the sandboxes (bubblewrap and what runs in it) of both: "tools".
Every sample walks the whole tree again, so processes started mid-run (sandboxes) are counted; a thread that
exits between two samples loses at most one interval of CPU time (reported as the sampling interval).

Hand-written rather than psutil: psutil is not a dependency of either venv, and the grouping needs the
thread names and parent links that /proc gives directly.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
ROLES = ("engine", "learner", "driver", "tools", "trl", "other")

# in-process agent-rl threads by their native name (agent_rl/thread_names.py sets them)
THREAD_ROLES = {"agent-rl-engine": "engine", "rollouts": "driver", "weight-broadcas": "learner"}


def _stat(path: Path) -> tuple[str, int, int, int] | None:
    """(comm, ppid, utime+stime ticks, processor) from a /proc stat file; None if it vanished."""
    try:
        raw = path.read_text()
    except OSError:
        return None
    lpar, rpar = raw.index("("), raw.rindex(")")
    comm = raw[lpar + 1 : rpar]
    rest = raw[rpar + 2 :].split()
    # rest[0] is field 3 (state): ppid field 4, utime 14, stime 15, processor 39
    return comm, int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[36])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_role(cmdline: str, parent_role: str | None, is_root: bool) -> str:
    """The role of a whole process from its command line and its parent's role (pure: unit-tested)."""
    if "trl_run.py" in cmdline:
        return "trl"
    if parent_role == "tools" or cmdline.startswith(("bwrap", "/usr/bin/bwrap")) or "sandbox" in cmdline:
        return "tools"
    if "agent_rl.engines.embedded.server" in cmdline or "embedded/server.py" in cmdline:
        return "engine"
    if "multiprocessing" in cmdline and ("spawn_main" in cmdline or "forkserver" in cmdline):
        return "learner"
    if is_root or parent_role in (None, "driver"):
        return "driver" if "train" in cmdline or is_root else (parent_role or "other")
    return parent_role or "other"


def thread_role(proc_role: str, comm: str, inprocess: bool) -> str:
    """A thread's role: its process's, except in the driver, by the thread's name; the driver's unnamed threads
    (the main thread: the trainer loop) count as the learner's when the learner runs in the driver."""
    if proc_role != "driver":
        return proc_role
    return THREAD_ROLES.get(comm, "learner" if inprocess else "driver")


@dataclass
class CpuSampler:
    """Samples the CPU time of `root` and all its descendants every `interval` s on a daemon thread."""

    root: int
    interval: float = 0.25
    inprocess: bool = False  # agent-rl's learner runs in the driver process (placement.topology: inprocess)
    steps_file: Path | None = None  # one line per finished step (metrics.jsonl, steps.jsonl): marks each step
    # steps done -> (monotonic time, CPU s per role) when that count was first seen
    marks: dict[int, tuple[float, dict[str, float]]] = field(default_factory=dict)
    _ticks: dict[tuple[int, int], int] = field(default_factory=dict)  # (pid, tid) -> last ticks seen
    _role: dict[tuple[int, int], str] = field(default_factory=dict)
    _proc_role: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    samples: int = 0

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = defaultdict(list)
        for d in os.listdir("/proc"):
            if d.isdigit():
                st = _stat(Path("/proc", d, "stat"))
                if st is not None:
                    children[st[1]].append(int(d))
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def sample(self) -> None:
        for pid in self._tree():
            if pid not in self._proc_role:
                st = _stat(Path(f"/proc/{pid}/stat"))
                parent = self._proc_role.get(st[1]) if st else None
                self._proc_role[pid] = process_role(_cmdline(pid), parent, pid == self.root)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                st = _stat(Path(f"/proc/{pid}/task/{tid}/stat"))
                if st is None:
                    continue
                key = (pid, int(tid))
                self._ticks[key] = max(self._ticks.get(key, 0), st[2])
                self._role[key] = thread_role(self._proc_role[pid], st[0], self.inprocess)
        self.samples += 1
        if self.steps_file is not None:
            n = _lines(self.steps_file)
            if n not in self.marks:
                self.marks[n] = (time.monotonic(), self.by_role())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> CpuSampler:
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop sampling (after one last sample) and return CPU seconds per role."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.by_role()

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for key, ticks in self._ticks.items():
            out[self._role[key]] += ticks / TICK
        return {r: round(out[r], 3) for r in ROLES if out.get(r)}

    def per_step(self, first: int = 1) -> dict[str, float] | None:
        """CPU seconds per step by role over the steps after the first `first` (start-up and the first steps'
        warm-up left out), with the wall seconds per step under "wall"; None when too few steps were seen."""
        seen = sorted(n for n in self.marks if n >= first)
        if len(seen) < 2:
            return None
        (t0, a), (t1, b) = self.marks[seen[0]], self.marks[seen[-1]]
        n = seen[-1] - seen[0]
        out = {r: round((b.get(r, 0.0) - a.get(r, 0.0)) / n, 3) for r in ROLES if b.get(r)}
        return out | {"wall": round((t1 - t0) / n, 3), "steps": n}


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0


def watch(
    pid: int, *, inprocess: bool = False, steps_file: Path | None = None, interval: float = 0.25
) -> CpuSampler:
    """Start sampling the process tree under `pid` now; `steps_file`: mark when each step ends (its lines)."""
    return CpuSampler(pid, interval, inprocess, steps_file).start()
