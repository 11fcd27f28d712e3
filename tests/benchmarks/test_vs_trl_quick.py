"""benchmarks/vs_trl.py --quick and benchmarks/vs_trl_profile.py --quick end to end, as a user runs them (issue 58: every
benchmark's machinery check in CI): TRL 1.16 in .venv-trl (`make test-heavy` makes it: scripts/setup_trl.sh), the
toy's small warm start, the tuning pass of both systems, the five cells, their checkpoints scored; then the profile of
the cells' CPU by role on the same warm start. Each results file carries the provenance block, and `--from-results`
gives back the same file and page from its own cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402
import vs_trl_profile  # noqa: E402
from test_quick_runs import META, _regenerates, _run  # noqa: E402
from test_vs_trl_results import check_summary, check_tuning  # noqa: E402
from vs_trl_report import cell_name  # noqa: E402

CELLS = {"agent-rl k=0", "agent-rl k=2", "trl shipped", "trl shipped-constant-lr", "trl closest"}


@pytest.mark.slow
# a warm start, 6 tuning runs, 5 cells, 10 evaluations, then 3 profiled cells: ~5 min on the idle 2-core machine
@pytest.mark.heavy
def test_the_quick_runs_tune_train_score_and_profile_both_systems(tmp_path: Path) -> None:
    if not (ROOT / ".venv-trl" / "bin" / "python").is_file():
        pytest.skip("no TRL environment in .venv-trl: bash scripts/setup_trl.sh (make test-heavy makes it)")
    work, out = tmp_path / "work", tmp_path / "out"
    _run("benchmarks/vs_trl.py", "--quick", "--work", str(work), "--out", str(out))
    data = json.loads((out / "vs_trl_quick.json").read_text())
    job = vs_trl.JOBS["tiny"]
    assert set(data["meta"]) >= META, sorted(META - set(data["meta"]))
    # TRL's side ran in .venv-trl, layered on .venv: the same torch and transformers as agent-rl's, and the page says so
    ours, trl = data["meta"]["versions"], data["meta"]["venvs"]["trl"]
    assert trl["trl"] and all(trl[p] == ours[p] for p in ("torch", "transformers")), (ours, trl)
    assert (
        f"TRL {trl['trl']}; torch {ours['torch']}, transformers {ours['transformers']}."
        in (out / "vs_trl_quick.md").read_text()
    )
    assert (data["model"], data["samples_per_step"]) == (job.label, job.quick_prompts * vs_trl.GROUP)
    assert {cell_name(r) for r in data["cells"]} == CELLS
    check_tuning(data, vs_trl.candidates(job, quick=True))
    check_summary(data, job.goal_speedup)
    steps, every = job.quick_sizes[:2]
    for r in data["cells"]:  # every run trained its steps and had the warm start and each checkpoint scored
        assert (r["steps"], len(r["curve"])) == (steps, 1 + steps // every), cell_name(r)
    assert (out / "vs_trl_quick.png").is_file()
    _regenerates("vs_trl", out, "vs_trl_quick", tmp_path / "again")

    _run("benchmarks/vs_trl_profile.py", "--quick", "--work", str(work), "--out", str(out))
    prof = json.loads((out / "vs_trl_profile_quick.json").read_text())
    assert set(prof["meta"]) >= META and prof["steps"] == 4
    assert [r["cell"] for r in prof["runs"]] and {r["cell"] for r in prof["runs"]} == {
        vs_trl_profile.key(c) for c in vs_trl_profile.cells(quick=True)
    }
    for r in prof["runs"]:  # each cell's step timed and its CPU split by the roles that own the threads
        roles = {"trl"} if r["cell"].startswith("trl") else {"engine", "learner", "driver"}
        assert r["s_per_step"] > 0 and all(r["cpu_s_per_step"][role] > 0 for role in roles), r
    _regenerates("vs_trl_profile", out, "vs_trl_profile_quick", tmp_path / "again")
