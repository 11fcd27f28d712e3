"""The responses report completes a study in parts: the cells an earlier report measured count with new run dirs."""

from __future__ import annotations

import json
from pathlib import Path


def test_the_responses_report_keeps_the_cells_an_earlier_report_measured(tmp_path: Path) -> None:
    from benchmarks.stress.responses_report import earlier_cells
    from benchmarks.stress.responses_report import main as responses_main

    out = tmp_path / "responses.md"
    earlier = {"final_mean": 0.5, "final_std": 0.0, "collapsed": 0, "wall_mean": 10.0}
    earlier |= {"seeds": 4, "rollbacks": 0, "warned": 0, "bound_mean": None, "staleness_mean": 0.0}
    out.with_suffix(".json").write_text(json.dumps({"fixed|k=0": earlier}))
    runs = tmp_path / "runs"
    for mode in ("adapt", "fixed"):
        d = runs / f"stress_r_{mode}_k16_s0"
        d.mkdir(parents=True)
        (d / "resolved_config.json").write_text(json.dumps({"train": {"steps": 2}}))
        recs = [{"step": 0, "time": 1.0}, {"step": 1, "time": 3.0, "eval/accuracy": 0.4}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    responses_main(str(runs), str(out))
    cells = earlier_cells(out.with_suffix(".json"))
    assert cells[("fixed", 0)]["seeds"] == 4  # kept from the earlier report
    assert cells[("adapt", 16)]["final_mean"] == 0.4 and cells[("fixed", 16)]["seeds"] == 1
    assert "| 16 | k=0 (sync) | 4 |" in out.read_text()  # the new k compared with the kept sync cell


def test_a_cell_is_the_mean_and_sample_std_of_its_seeds_finals(tmp_path: Path) -> None:
    """Two seeds ending at 0.2 and 0.6: mean 0.4, sample std sqrt(0.08) = 0.283 (not the SE, 0.2); 0.2 is below the
    warm start (0.25): one collapse."""
    from benchmarks.stress.responses_report import collect

    for seed, acc in ((0, 0.2), (1, 0.6)):
        d = tmp_path / f"stress_r_adapt_k8_s{seed}"
        d.mkdir()
        (d / "resolved_config.json").write_text(json.dumps({"train": {"steps": 2}}))
        recs = [{"step": 0, "time": 1.0}, {"step": 1, "time": 5.0, "eval/accuracy": acc}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    c = collect(tmp_path)[("adapt", 8)]
    assert c["seeds"] == 2 and abs(c["final_mean"] - 0.4) < 1e-12  # a few ulps of a two-term mean
    assert abs(c["final_std"] - 0.08**0.5) < 1e-12 and c["collapsed"] == 1 and c["wall_mean"] == 5.0
