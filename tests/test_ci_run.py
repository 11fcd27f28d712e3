""".ci/run, the script CI runs: its jobs in order, the first failure ends it with make's status, and each job's wall
time is printed (CI keeps only a failed run's output, so the times are how a slow landing is found). Run against a
copy of the script beside a Makefile whose targets only echo, so nothing heavy runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ci(tmp_path: Path, failing: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / ".ci").mkdir(exist_ok=True)
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    rules = [
        f"{t}:\n\t@echo ran {t}{'; exit 3' if t == failing else ''}\n"
        for t in ("test", "test-heavy", "test-harnesses")
    ]
    (tmp_path / "Makefile").write_text("".join(rules))
    # as CI starts it: not under a make of its own (`make test` runs this file: its MAKEFLAGS and MAKELEVEL would
    # make the inner make print "Entering directory" lines)
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    }
    return subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run"), *args], capture_output=True, text=True, env=env
    )


def test_all_runs_the_three_jobs_in_order_and_prints_each_ones_time(tmp_path: Path) -> None:
    proc = _ci(tmp_path, None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["ran test", "ran test-heavy", "ran test-harnesses"]
    timed = [ln for ln in proc.stderr.splitlines() if ln.startswith(".ci/run: make ")]
    assert [ln.split()[2] for ln in timed] == ["test", "test-heavy", "test-harnesses"], proc.stderr
    assert all(ln.endswith("(exit 0)") and " took " in ln for ln in timed), timed


@pytest.mark.parametrize("failing", ["test", "test-heavy", "test-harnesses"])
def test_a_failing_job_ends_the_run_with_makes_status(tmp_path: Path, failing: str) -> None:
    proc = _ci(tmp_path, failing)
    jobs = ["test", "test-heavy", "test-harnesses"]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)  # make's status for a failed recipe
    assert proc.stdout.split() == [w for j in jobs[: jobs.index(failing) + 1] for w in ("ran", j)]
    assert f".ci/run: make {failing} took" in proc.stderr and "(exit 2)" in proc.stderr


def test_one_job_by_name_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    proc = _ci(tmp_path, None, "heavy")
    assert (proc.returncode, proc.stdout) == (0, "ran test-heavy\n")
    proc = _ci(tmp_path, None, "heavvy")
    assert proc.returncode == 2 and "unknown job 'heavvy' (all, test, heavy or harnesses)" in proc.stderr
