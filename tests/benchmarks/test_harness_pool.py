"""benchmarks/harness/pool.py's drain loop on in-process runs (no processes): the plan asked again after each run
finishes, a run never started twice, a stop time that starts nothing, the report hook every `jobs` runs, and
--stop-starting-after's check. The signals (SIGUSR1 drains, SIGTERM stops the runs' processes) are tested through
the k-sweep's command in tests/benchmarks/stress/test_k_sweep.py."""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass

import pytest

from benchmarks.harness import pool


@dataclass(frozen=True)
class Run:
    name: str
    part: str = "select"


@pytest.fixture(autouse=True)
def _not_draining():
    pool.DRAINING.clear()
    yield
    pool.DRAINING.clear()


def test_the_plan_is_asked_again_after_each_run_and_a_run_is_never_started_twice() -> None:
    """A selection run's result decides the next runs (as an lr selection decides the held-out ones)."""
    finished: list[str] = []
    lock = threading.Lock()

    def plan() -> list[Run]:
        with lock:
            done = set(finished)
        if "a" not in done:
            return [Run("a")]  # until a finished, only a is known (b, c are planned from its result)
        return [Run(n, "heldout") for n in ("b", "c") if n not in done]

    def run(p: Run) -> str:
        with lock:
            finished.append(p.name)
        return f"{p.name}: done"

    reports: list[int] = []
    drained = pool.drain(
        plan, run, 1, "t", lambda p: p.name, every_jobs=lambda: reports.append(len(finished))
    )
    assert drained is False and finished == ["a", "b", "c"] and reports == [1, 2, 3]


def test_a_plan_that_still_names_a_started_run_does_not_start_it_again() -> None:
    """Its result not in yet (say a failed run leaves no final_eval.json), a plan names it again: not run twice."""
    calls: list[str] = []
    drained = pool.drain(lambda: [Run("a"), Run("b")], lambda p: calls.append(p.name) or "x", 2, "t", str)
    assert drained is False and sorted(calls) == ["a", "b"]


def test_past_the_stop_time_nothing_starts_and_it_says_it_drained(capsys: pytest.CaptureFixture) -> None:
    calls: list[str] = []
    drained = pool.drain(lambda: [Run("a")], lambda p: calls.append(p.name) or "x", 1, "t", str,
                         stop_starting_at=time.monotonic() - 1)  # fmt: skip
    assert drained is True and calls == []
    assert "t: --stop-starting-after: starting no new run; 0 training" in capsys.readouterr().out


def test_stop_starting_after_is_minutes_0_or_more_and_a_bad_value_is_named() -> None:
    ap = argparse.ArgumentParser()
    pool.pool_args(ap)
    assert pool.stop_time(ap.parse_args([]), "t") is None
    before = time.monotonic()
    at = pool.stop_time(ap.parse_args(["--stop-starting-after", "2"]), "t")
    assert at is not None and before + 120 <= at <= time.monotonic() + 120
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit, match=rf"t: --stop-starting-after {bad}: give the minutes, 0 or more"):
            pool.stop_time(ap.parse_args(["--stop-starting-after", bad]), "t")
