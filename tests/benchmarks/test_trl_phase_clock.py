"""benchmarks/trl_run.py's PhaseClock: each timed method's own time, its timed callees counted to theirs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from trl_run import PhaseClock  # noqa: E402


def _busy(seconds: float) -> None:
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        pass


class Fake:
    """Stands in for the trainer: an outer method that calls an inner one (as scoring calls generation)."""

    def outer(self) -> None:
        _busy(0.05)
        self.inner()

    def inner(self) -> None:
        _busy(0.1)


def test_nested_phases_are_exclusive_and_add_up_to_the_whole() -> None:
    clock, fake = PhaseClock(), Fake()
    clock.wrap(fake, "inner", "generate")
    clock.wrap(fake, "outer", "score_other")
    t0, c0 = time.perf_counter(), time.process_time()
    fake.outer()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    got = clock.take()
    # busy loops measured by the same clock: each phase at least what it burned itself, never its callee's
    assert got["phase_cpu_generate"] >= 0.1
    assert 0.05 <= got["phase_cpu_score_other"] < 0.1
    # exclusive phases never count a second twice: together within the outer call as timed around it (plus
    # take()'s rounding to 1e-4 s per phase)
    assert got["phase_generate"] + got["phase_score_other"] <= wall + 2e-4
    assert got["phase_cpu_generate"] + got["phase_cpu_score_other"] <= cpu + 2e-4
    assert clock.take() == {}  # take() resets for the next step
