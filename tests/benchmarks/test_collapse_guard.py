"""benchmarks/collapse_guard.py without running the main job: the summary's counts, the paired difference and its
words, the page, resuming from runs already in the work folder, and a bad --lr. The main job with the guard is
`make run`'s; the guard's decisions are tests/loop/test_monitor_responses.py's."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import collapse_guard as cg  # noqa: E402


def rec(cell: str, seed: int, after: float, rollbacks: int = 0, warned: int | None = None) -> dict:
    return {
        "cell": cell, "seed": seed, "before": 0.25, "after": after, "collapsed": after < 0.25, "seconds": 80.0,
        "first_warning": warned, "rollbacks": rollbacks, "steps": 40, "reward_last": 0.5,
    }  # fmt: skip


RECORDS = [
    rec("log", 0, 0.02, warned=20), rec("rollback", 0, 0.60, rollbacks=1, warned=21),
    rec("rollback", 1, 0.70), rec("log", 1, 0.72),
    rec("log", 2, 0.05, warned=25), rec("rollback", 2, 0.40, rollbacks=2, warned=24),
]  # fmt: skip


def test_summary_counts_collapses_and_rollbacks_and_pairs_the_cells_by_seed() -> None:
    s = cg.summarize(RECORDS)
    log, rb = s["cells"]["log"], s["cells"]["rollback"]
    assert (log["collapsed"], log["warned"], log["rollbacks"]) == (2, 2, 0)
    assert (rb["collapsed"], rb["warned"], rb["rollbacks"]) == (0, 2, 3)
    assert log["after_mean"] == pytest.approx((0.02 + 0.72 + 0.05) / 3)
    gap = s["rollback_minus_log"]
    diffs = [0.58, -0.02, 0.35]  # rollback - log, seed by seed
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert gap["diff"] == pytest.approx(mean) and gap["se"] == pytest.approx(sd / math.sqrt(3))
    assert gap["separated"] is False  # 0.30 ± 0.17: under 2 SE


def test_page_names_the_lr_the_cells_and_every_run(tmp_path: Path) -> None:
    data = {
        "meta": {"command": "c", "date": "d", "commit": "x", "load_before": [0.1], "load_after": [0.2]},
        "lr": 1e-3, "seeds": [0, 1, 2], "summary": cg.summarize(RECORDS), "missing": [], "runs": RECORDS,
    }  # fmt: skip
    text = cg.render(data)
    assert text.startswith("# The main job's collapse guard, learner.lr 0.001")
    assert "| rollback | 3 | 0.57 ± 0.09 | 0/3 | 2 | 3 | 80 |" in text
    assert "| log seed 0 | 0.25 | 0.02 | 20 | 0 | 40 | 80.0 |" in text
    assert "rollback − log, paired by seed: +0.30 ± 0.17" in text and "not separated" in text


def test_runs_already_in_the_work_folder_are_reported_not_rerun(tmp_path: Path) -> None:
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "out"
    args = ["--lr", "1e-3", "--seeds", "0", "1", "2", "--work", str(tmp_path), "--out", str(out)]
    assert cg.main(args) == 0
    data = json.loads((out / "collapse_guard_lr0.001.json").read_text())
    assert len(data["runs"]) == 6 and not data["missing"] and data["lr"] == 1e-3
    assert (out / "collapse_guard_lr0.001.md").is_file()
    assert cg.results_name(cg.RECIPE_LR) == "collapse_guard"  # the recipe's own lr keeps the plain name


def test_a_non_positive_lr_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cg.main(["--lr", "0"])
    assert "--lr must be > 0, got 0" in capsys.readouterr().err
