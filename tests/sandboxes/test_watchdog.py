"""The container watchdog's loop against every interleaving of its probes with an exec's process.

No engine: `watch` is the loop the container's main process runs (sandboxes/docker_engine.py), driven here by a
scripted process table in which each probe is one instant. The exec's process appears before probe number
`created` and is gone `life` instants later; the watchdog must outlive it, and then return.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sandboxes.docker_engine import WATCHDOG_LOOP


def _watch() -> Callable[..., None]:
    namespace: dict[str, object] = {}
    exec(WATCHDOG_LOOP, namespace)
    return namespace["watch"]  # type: ignore[return-value]


class ProcessTable:
    """One process other than init and the watchdog, alive over instants [created, created + life)."""

    def __init__(self, created: int, life: int):
        self.now, self.created, self.life, self.slept = 0, created, life, 0

    def _tick(self) -> int:
        t, self.now = self.now, self.now + 1
        return t

    def started(self) -> bool:  # /proc/loadavg's last pid is newer than the watchdog's
        return self._tick() >= self.created

    def alive(self) -> bool:
        t = self._tick()
        return self.created <= t < self.created + self.life

    def elapsed(self) -> float:
        self._tick()
        return float(self.slept)

    def sleep(self, seconds: float) -> None:
        self._tick()
        self.slept += int(seconds)


@pytest.mark.parametrize("life", [1, 2, 5])
@pytest.mark.parametrize("created", range(12))
def test_the_watchdog_never_returns_while_the_exec_process_lives_whatever_the_interleaving(
    created: int, life: int
):
    table = ProcessTable(created, life)
    _watch()(table.started, table.alive, table.elapsed, table.sleep, patience=100.0)
    assert table.now > created + life - 1, (
        f"returned at instant {table.now}, the process lived until {created + life}"
    )
    assert table.now <= created + life + 4  # and it returns soon after: one sleep and one round of probes


def test_the_watchdog_returns_once_its_patience_is_over_when_no_process_ever_starts():
    table = ProcessTable(created=10**9, life=1)
    _watch()(table.started, table.alive, table.elapsed, table.sleep, patience=3.0)
    assert table.slept == 4  # slept past the patience (3 s), then returned
