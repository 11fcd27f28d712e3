"""How busy the machine's cores were over a window, from /proc/stat: every user of the machine counted (a run's own
processes, the containers its tools run in under dockerd, anyone else's). A study reads it to say what bounds a
speed-up: a run that already keeps every core busy leaves asynchrony no idle core to fill.

Linux only; elsewhere `cpu_times()` is empty and `busy()` gives []. Hand-written: a few lines of /proc parsing, and
psutil is not a dependency of the benchmarks' venvs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def cpu_times() -> list[tuple[int, int]]:
    """(busy, total) clock ticks of each core since boot, from /proc/stat's cpuN lines (idle and iowait not busy)."""
    out = []
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        if line.startswith("cpu") and line[3:4].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]
            out.append((sum(v) - idle, sum(v)))
    return out


def busy(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> list[float]:
    """Each core's share busy (0..1) between two `cpu_times()` readings."""
    return [(a[0] - b[0]) / max(1, a[1] - b[1]) for a, b in zip(after, before, strict=True)]


def busy_during(run: Callable[[], T]) -> tuple[T, list[float]]:
    """`run()`'s result, and each core's share busy while it ran."""
    before = cpu_times()
    out = run()
    return out, busy(before, cpu_times())
