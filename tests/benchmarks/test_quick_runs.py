"""Every in-process benchmark on the harness runs its `--quick` machinery check in CI (issue 58): the benchmark as a
user runs it, in its own process, into a scratch folder; its results file carries the provenance block, and
`--from-results` gives back the same file and page from the quick run's own raw data.

`topology` and `trajectory_log_bench` train (`agent-rl train` per cell, from a random tiny model), `engine_fork` too
(from the agent_arith pipeline's small warm start, built in the test's work folder): heavy. The other
benchmarks that train (`async_vs_sync`, `distill`, `moe_replay`) and `engine_bench` have their own `--quick` tests
(make test-heavy), and so do the TRL ones (`vs_trl`, `vs_trl_profile`: test_vs_trl_quick.py, in .venv-trl) and the
container one (`slow_tools`: tests/sandboxes/test_slow_tools_quick.py); docs/benchmarks/harness.md, "In CI"."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks.harness import report  # noqa: E402

META = {"command", "date", "commit", "cpu", "load_before", "load_after", "elapsed_s", "versions"}

# benchmark -> the results file its --quick run writes
QUICK = {
    "vcpo_overhead": "vcpo_overhead",
    "learner_step": "learner_step",
    "learner_step_agent_arith": "learner_step_agent_arith",
    "env_bench": "env_bench",
    "constrained_is": "constrained_is",
    "mismatch": "mismatch",
    "orchestration": "orchestration",
    "sandbox_bench": "sandbox_bench",
}


def _run(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _regenerates(bench: str, out: Path, name: str, again: Path) -> None:
    """`--from-results` of OUT/NAME.json writes the same file and page into AGAIN."""
    _run(f"benchmarks/{bench}.py", "--from-results", str(out / f"{name}.json"), "--out", str(again))
    assert json.loads((again / f"{name}.json").read_text()) == json.loads((out / f"{name}.json").read_text())
    assert (again / f"{name}.md").read_text() == (out / f"{name}.md").read_text()


def _check(tmp_path: Path, bench: str, name: str, *extra: str) -> None:
    _run(f"benchmarks/{bench}.py", "--quick", "--out", str(tmp_path / "quick"), *extra)
    data = json.loads((tmp_path / "quick" / f"{name}.json").read_text())
    assert set(data["meta"]) >= META, sorted(META - set(data["meta"]))
    assert data["meta"]["command"].startswith(f"{bench}.py --quick")
    _regenerates(bench, tmp_path / "quick", name, tmp_path / "again")


@pytest.mark.slow
@pytest.mark.parametrize(
    "bench",
    # orchestration: ~1 min (rollout worker processes, both paths): make test-heavy; the others 2-15 s each
    [pytest.param(b, marks=pytest.mark.heavy) if b == "orchestration" else b for b in QUICK],
)
def test_the_quick_run_writes_a_results_file_that_regenerates_from_its_runs(
    tmp_path: Path, bench: str
) -> None:
    # orchestration resumes from its work folder's runs: a fresh one, so that every run of the test runs its cells
    _check(
        tmp_path,
        bench,
        QUICK[bench],
        *(["--work", str(tmp_path / "work")] if bench == "orchestration" else []),
    )


@pytest.mark.slow
@pytest.mark.heavy  # `agent-rl train` runs (one per cell) from a random tiny model: make test-heavy
@pytest.mark.parametrize("bench", ["topology", "trajectory_log_bench", "engine_fork"])
def test_the_quick_training_runs_write_a_results_file_that_regenerates_from_its_runs(
    tmp_path: Path, bench: str
) -> None:
    _check(tmp_path, bench, bench, "--work", str(tmp_path / "work"))


def test_quick_sets_its_sizes_and_an_option_after_it_wins() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--code-only", action="store_true")
    report.quick_args(p, repeats=1, code_only=True)
    assert vars(p.parse_args([])) == {"repeats": 5, "code_only": False, "quick": False}
    assert vars(p.parse_args(["--quick"])) == {"repeats": 1, "code_only": True, "quick": True}
    assert p.parse_args(["--quick", "--repeats", "2"]).repeats == 2
    assert "--repeats 1, --code-only" in p.format_help().replace("\n", " ").replace("  ", " ")
