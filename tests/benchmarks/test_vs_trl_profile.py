"""benchmarks/vs_trl_profile.py: a run reused from an earlier invocation reports the loads it ran under (kept
beside it), never the load of the invocation that reused it; one reused without a kept load says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vs_trl_profile as vp  # noqa: E402


def test_a_reused_run_keeps_the_loads_it_ran_under(tmp_path, monkeypatch) -> None:
    runs: dict[Path, str] = {}
    monkeypatch.setattr(vp, "finished", lambda d, c, seed, steps: runs.get(d))

    def train(c, seed, model, d, *args):  # as vs_trl.train: makes the run's folder, resumes a finished one
        d.mkdir(parents=True, exist_ok=True)
        return runs.setdefault(d, "run")

    monkeypatch.setattr(vp, "train", train)
    loads = iter([(3.0, 0, 0), (5.0, 0, 0), (40.0, 0, 0), (50.0, 0, 0)])
    monkeypatch.setattr(vp.os, "getloadavg", lambda: next(loads))
    d = tmp_path / "profile" / "cell_s0"

    assert vp.timed(None, 0, tmp_path, d, 10, tmp_path) == ("run", [3.0, 5.0], False)
    assert json.loads(d.with_suffix(".load.json").read_text()) == [3.0, 5.0]
    # the next invocation reuses it: its loads are the first run's, not the 40-50 of now
    assert vp.timed(None, 0, tmp_path, d, 10, tmp_path) == ("run", [3.0, 5.0], True)

    other = tmp_path / "profile" / "cell_s1"
    runs[other] = "older run"  # finished before loads were kept beside runs
    assert vp.timed(None, 0, tmp_path, other, 10, tmp_path) == ("older run", [None, None], True)


def _run(cell: str, seed: int, s_per_step: float) -> dict:
    return {"cell": cell, "seed": seed, "s_per_step": s_per_step, "cores_busy": None, "cpu_s_per_step": {},
            "phases_s": {"step": s_per_step}}  # fmt: skip


def test_a_ratio_to_trl_is_the_median_of_the_per_seed_ratios() -> None:
    """The cell's s/step over TRL's fastest cell's at the same seed, the median over seeds (benchmarks/harness/stats.py):
    here 1.0 (per seed 1, 2, 0.5), where the ratio of the two cells' medians would be 4 / 2 = 2.0."""
    trl, cell = vp.key(vp.cells()[0]), vp.key(vp.cells()[1])
    runs = [_run(trl, 0, 1.0), _run(trl, 1, 2.0), _run(trl, 2, 8.0)]
    runs += [_run(cell, 0, 1.0), _run(cell, 1, 4.0), _run(cell, 2, 4.0)]
    s = vp.summary(runs)
    assert s["s_per_step_over_trl_fastest"] == {trl: 1.0, cell: 1.0}
    assert (s["cells"][cell]["s_per_step"], s["cells"][trl]["s_per_step"]) == (4.0, 2.0)
    # a seed without TRL's run has no ratio; most seeds without one: no median
    assert vp.summary([_run(trl, 0, 1.0), _run(cell, 1, 4.0)])["s_per_step_over_trl_fastest"] == {
        trl: 1.0,
        cell: None,
    }
