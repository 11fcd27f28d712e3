"""A process and its living descendants, read from Linux /proc (the loop tests that kill or stop a real run)."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, parent pid, ...); None if the process is gone."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    return (fields := _stat(pid)) is not None and fields[0] != "Z"


def tree(root: int) -> set[int]:
    """`root` and its living descendants."""
    parents = {
        int(d.name): fields
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and (fields := _stat(int(d.name)))
    }
    out = [root]
    for pid in out:
        out += [c for c, f in parents.items() if int(f[1]) == pid and f[0] != "Z"]
    return set(out)
