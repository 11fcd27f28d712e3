"""Per-sandbox cgroup with a memory cap and a process cap, where the host lets us make one.

Why: RLIMIT_NPROC is counted per uid across *all* sandboxes (one fork bomb would starve the
others) and RLIMIT_AS is per process; a cgroup caps the sandbox as a whole. This is the
mechanism nsjail uses for its cgroup limits; we set it up directly around bwrap. Supports
cgroup v1 (separate `memory` and `pids` hierarchies) and v2 (unified). Returns None when the
hierarchy is missing or not writable (not root, read-only /sys/fs/cgroup); callers then fall
back to rlimits only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()
_sweeps = itertools.count()
_PREFIX = "agent-rl-sandbox-"


def _stale_candidates() -> list[Path]:
    """Our cgroups at the depths sandboxes make them. A pattern whose walk meets a cgroup removed meanwhile (a
    container's, as a Docker engine stops it) is skipped this time: the next owner's sweep finds what it missed."""
    found: list[Path] = []
    for pattern in (f"*/{_PREFIX}*", f"*/*/*/{_PREFIX}*", f"{_PREFIX}*"):
        with contextlib.suppress(OSError):
            found += list(_ROOT.glob(pattern))
    return found


def _sweep_stale() -> None:
    """Remove empty cgroups left by sandbox owners that died (their pid is in the name)."""
    for d in _stale_candidates():
        owner = d.name.removeprefix(_PREFIX).split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                d.rmdir()


def _own_path(controller: str) -> str:
    """This process's cgroup path for `controller` ('' for v2), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller and controller in names.split(",")) or (not controller and names == ""):
            return path.lstrip("/")
    raise FileNotFoundError(f"no {controller or 'v2'} entry in /proc/self/cgroup")


@dataclass
class SandboxCgroup:
    dirs: list[Path]

    @classmethod
    def create(cls, memory_bytes: int, pids: int) -> SandboxCgroup | None:
        if next(_sweeps) == 0:
            _sweep_stale()
        name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        try:
            if (_ROOT / "cgroup.controllers").exists():
                base = _ROOT / _own_path("")
                cg = cls([base / name])
                cg.dirs[0].mkdir()
                cg._write("memory.max", memory_bytes)
                cg._write("memory.swap.max", 0, optional=True)
                cg._write("pids.max", pids)
            else:
                mem = _ROOT / "memory" / _own_path("memory") / name
                pid = _ROOT / "pids" / _own_path("pids") / name
                cg = cls([])
                for d in (mem, pid):
                    d.mkdir()
                    cg.dirs.append(d)
                cg._write("memory.limit_in_bytes", memory_bytes)
                cg._write("memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                cg._write("pids.max", pids)
        except (OSError, FileNotFoundError, ValueError):
            with contextlib.suppress(UnboundLocalError):
                cg.remove()
            return None
        return cg

    def _write(self, filename: str, value: int, optional: bool = False) -> None:
        for d in self.dirs:
            path = d / filename
            if path.exists():
                path.write_text(str(value))
                return
        if not optional:
            raise FileNotFoundError(f"{filename} not found in {self.dirs}")

    def join(self) -> None:
        """Move the calling process into the cgroup (called in the child before exec)."""
        pid = str(os.getpid())
        for d in self.dirs:
            (d / "cgroup.procs").write_text(pid)

    def remove(self) -> None:
        """Remove the cgroup dirs; retried briefly because the kernel frees them a moment after the last exit."""
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
