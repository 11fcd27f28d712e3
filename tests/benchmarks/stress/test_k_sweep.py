"""The k-sweep's planning, run reading and report (verdict wording against the file), on hand-made runs."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.stress import k_sweep as ks
from benchmarks.stress.k_sweep_report import SEPARATION, verdict_lines, write
from benchmarks.stress.level_b_fair import LABEL

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "loop"))
from proc_tree import alive, tree  # noqa: E402  (the loop tests' reader of /proc; a zombie is not alive)

RESULTS = ROOT / "benchmarks" / "results" / "stress" / "k_sweep.json"
WARM0 = ks.WarmStart(0.1, "a" * 64)  # the hand-made runs' warm start


def _cell(method: str, lr: float, k: int, seed: int, acc: float) -> ks.Cell:
    return ks.Cell(method, lr, k, seed, acc, ((0, 0.1), (ks.STEPS, acc)), (1.0, 0.5), ks.STEPS, 0.1, "a" * 64)


def _cells(rows) -> dict[tuple, ks.Cell]:
    return {(m, lr, k, s): _cell(m, lr, k, s, a) for m, lr, k, s, a in rows}


def _selection(best: dict[str, float], grown: bool = True) -> list[tuple]:
    """Every method at every lr on the selection seeds at k=8; best[m] scores 0.6, the others 0.3. grown: with
    the runs at the lr past a best at the grid's edge (scoring 0.3 too), so that every selection is done."""
    past = (ks.LRS[0] / 2, ks.LRS[-1] * 2) if grown else ()
    return [(m, lr, ks.SELECT_LAG, s, 0.6 if lr == best[m] else 0.3) for m in ks.METHODS for lr in ks.LRS + past
            if lr in ks.LRS or lr in (best[m] / 2, best[m] * 2) for s in ks.SELECT_SEEDS]  # fmt: skip


BEST = dict(zip(ks.METHODS, [ks.LRS[i % len(ks.LRS)] for i in range(len(ks.METHODS))], strict=True))


def test_the_lr_is_chosen_at_k8_on_the_selection_seeds_only() -> None:
    rows = _selection(BEST)
    # held-out seeds at k=8 and selection seeds at another k that would pick another lr if they were read
    rows += [(m, lr, ks.SELECT_LAG, s, 0.99 if lr != BEST[m] else 0.0) for m in ks.METHODS for lr in ks.LRS
             for s in ks.HELDOUT_SEEDS]  # fmt: skip
    rows += [(m, lr, 4, s, 0.99 if lr != BEST[m] else 0.0) for m in ks.METHODS for lr in ks.LRS for s in ks.SELECT_SEEDS]  # fmt: skip
    assert ks.select_lrs(_cells(rows)) == BEST


def test_heldout_runs_start_per_method_once_its_selection_is_complete_lowest_k_first() -> None:
    rows = [r for r in _selection(BEST) if not (r[0] == "tis" and r[1] == ks.LRS[0] and r[3] == 2)]
    cells = _cells(rows)
    assert ks.select_lrs(cells)["tis"] is None
    held = ks.plan("heldout", cells)
    assert not any("_tis_" in p.name for p in held) and any("_mis_" in p.name for p in held)
    assert [p.k for p in held] == sorted(p.k for p in held)  # k=0 first, k=64 last
    assert {p.seed for p in held} == set(ks.HELDOUT_SEEDS)
    mis = next(p for p in held if "_mis_" in p.name and p.k == 8)
    assert mis.name == ks.run_name("mis", BEST["mis"], 8, mis.seed)
    assert f"learner.lr={BEST['mis']:g}" in mis.sets and "algorithm.loss=mis" in mis.sets


def test_k0_cells_of_the_corrected_methods_are_plains_or_vcpos_runs_at_their_own_lr() -> None:
    held = [p for p in ks.plan("heldout", _cells(_selection(BEST))) if p.k == 0]
    names = {p.name for p in held}
    # tis/mis/m2po/ess_lr make plain's update at k=0 and opob makes VCPO's: their k=0 runs are those
    assert not any(re.match(r"ksweep_(tis|mis|m2po|ess_lr|opob)_", n) for n in names)
    expect = {ks.run_name(ks.twin(m, 0), lr, 0, s) for m, lr in BEST.items() for s in ks.HELDOUT_SEEDS}
    assert names == expect


def test_plan_skips_finished_runs_and_the_cells_an_earlier_report_kept(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "out" / "k_sweep.json"
    _finish(runs, "plain", ks.LRS[0], 8, 0, acc=0.4)
    write(ks.read_cells(runs, warm_start=WARM0), out, quiet=True)
    later = tmp_path / "later"  # a later session: the run dirs are gone, the report's cells still count
    _finish(later, "vcpo", ks.LRS[0], 8, 0, acc=0.5)
    cells = ks.read_cells(later, out, warm_start=WARM0)
    names = [p.name for p in ks.plan("select", cells)]
    assert (
        ks.run_name("plain", ks.LRS[0], 8, 0) not in names
        and ks.run_name("vcpo", ks.LRS[0], 8, 0) not in names
    )
    assert len(names) == len(ks.METHODS) * len(ks.LRS) * len(ks.SELECT_SEEDS) - 2
    runner = ks.Runner(later, WARM0)
    assert runner(ks.Planned(ks.run_name("vcpo", ks.LRS[0], 8, 0), "select", "vcpo", 8, 0, ())).endswith(
        "done already"
    )


def _finish(runs: Path, method: str, lr: float, k: int, seed: int, acc: float, evals=()) -> Path:
    """A run as the runner leaves it: metrics.jsonl (steps with ESS, periodic evals) and final_eval.json."""
    d = runs / ks.run_name(method, lr, k, seed)
    d.mkdir(parents=True)
    recs = [{"step": t, "vcpo/ess_ratio": 1.0 if t < k else 0.25} for t in range(ks.STEPS)]
    for step, version, a in evals:
        recs[step] |= {"eval/accuracy": a, "eval/policy_version": version}
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "final_eval.json").write_text(json.dumps({"accuracy": acc, "tasks": 100, "seed": seed}))
    return d


def test_a_run_is_read_at_the_policy_versions_its_evals_measured_and_its_auc_is_their_trapezoid_mean(
    tmp_path: Path,
) -> None:
    # k=16: the eval after step 39 ran on the engines' version 24, the one after step 79 on version 64
    _finish(tmp_path, "tis", ks.LRS[1], 16, 3, acc=0.6, evals=[(39, 24, 0.3), (79, 64, 0.5)])
    (cell,) = ks.read_cells(tmp_path, warm_start=WARM0).values()
    assert cell.curve == ((0, 0.1), (24, 0.3), (64, 0.5), (ks.STEPS, 0.6))
    area = 24 * (0.1 + 0.3) / 2 + 40 * (0.3 + 0.5) / 2 + 16 * (0.5 + 0.6) / 2
    assert cell.auc == pytest.approx(area / ks.STEPS)
    assert cell.ess_mean == pytest.approx((16 * 1.0 + 64 * 0.25) / ks.STEPS)
    assert cell.steps == ks.STEPS and not cell.collapsed


def test_bad_input_names_the_file_and_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default warm start, ks.WARM, is relative: none here
    _finish(tmp_path, "plain", ks.LRS[0], 8, 0, acc=float("nan"))
    with pytest.raises(ValueError, match=r"final_eval.json: field accuracy is nan"):
        ks.read_cells(tmp_path, warm_start=WARM0)
    with pytest.raises(ValueError, match=r"finished, but .*warm_eval.json is missing"):
        ks.read_cells(tmp_path)
    with pytest.raises(SystemExit, match="part 'bogus' is not one of calibrate, select, heldout"):
        ks.main(["plan", "bogus", "--runs", str(tmp_path), "--out", str(tmp_path / "x.json")])


def _heldout(k: int, finals: dict[str, list[float]]) -> list[tuple]:
    return [(ks.twin(m, k), BEST[m], k, s, a) for m, accs in finals.items() for s, a in zip(ks.HELDOUT_SEEDS, accs, strict=True)]  # fmt: skip


def test_the_verdict_names_the_best_method_says_whether_vcpo_is_ahead_and_puts_the_lags_where_it_is_not_first(
    tmp_path: Path,
) -> None:
    rows = _selection(BEST)
    low = {m: [0.30, 0.32, 0.28, 0.31, 0.29] for m in ks.METHODS}
    # k=4: VCPO ahead of TIS but within 2 SE; k=8: M2PO ahead of VCPO by far more than 2 SE
    rows += _heldout(4, low | {"tis": [0.50, 0.60, 0.40, 0.55, 0.45], "vcpo": [0.60, 0.50, 0.62, 0.48, 0.55]})
    rows += _heldout(
        8, low | {"m2po": [0.70, 0.71, 0.69, 0.72, 0.68], "vcpo": [0.40, 0.41, 0.39, 0.42, 0.38]}
    )
    report = write(_cells(rows), tmp_path / "k_sweep.json", quiet=True)
    s4, s8 = report["summary"]["4"], report["summary"]["8"]
    assert (s4["best"], s4["second"], s4["vcpo_best"], s4["lead_separated"]) == ("vcpo", "tis", True, False)
    assert s4["vcpo_side"] == "level"  # the highest mean, within 2 SE of the second: never "ahead"
    assert s4["lead_se"] == pytest.approx(math.sqrt(statistics.variance([0.60, 0.50, 0.62, 0.48, 0.55]) / 5
                                                    + statistics.variance([0.50, 0.60, 0.40, 0.55, 0.45]) / 5))  # fmt: skip
    assert (s8["best"], s8["vcpo_best"], s8["vcpo_gap_separated"], s8["vcpo_side"]) == (
        "m2po",
        False,
        True,
        "behind",
    )
    assert s8["complete"] and not report["summary"]["16"].get("best")
    lines = verdict_lines(report["summary"])
    assert lines[0].startswith("- k=8: VCPO is behind M2PO: VCPO") and "is below M2PO" in lines[0]
    assert "SE; separated)" in lines[0]
    assert lines[1].startswith("- k=4: VCPO is level with TIS (seq): VCPO") and "not separated" in lines[1]
    assert "ahead" not in lines[1]
    assert lines[-1] == "- k=64: not measured yet."
    md = (tmp_path / "k_sweep.md").read_text()
    assert (
        "\n".join(lines) in md
        and "runs missing; `nice -n 15 .venv/bin/python -m benchmarks.stress.k_sweep run`" in md
    )
    assert (tmp_path / "k_sweep.png").is_file()


def test_vcpo_against_each_method_in_words_puts_behind_first_and_level_within_two_se() -> None:
    from benchmarks.stress.k_sweep_report import vcpo_vs_lines

    vs = {
        "tis": {"8": {"difference": 0.06, "se": 0.02, "separated": True}},
        "opob": {"8": {"difference": 0.01, "se": 0.02, "separated": False}},
        "m2po": {"8": {"difference": 0.05, "se": 0.02, "separated": True},
                 "32": {"difference": -0.10, "se": 0.02, "separated": True}},
    }  # fmt: skip
    lines = vcpo_vs_lines(vs)
    assert lines == [
        "- k=32: VCPO is behind M2PO (-0.10 ± 0.02, 5.0 SE).",
        "- k=8: VCPO is level with OPOB alone (+0.01 ± 0.02, 0.5 SE); ahead of TIS (seq) (+0.06 ± 0.02, 3.0 SE), "
        "M2PO (+0.05 ± 0.02, 2.5 SE).",
    ]


def test_the_missing_runs_are_named_by_lag_method_and_seed(tmp_path: Path) -> None:
    rows = _selection(BEST) + _heldout(4, {m: [0.3] * 5 for m in ks.METHODS})
    late = {("vcpo", 4, 6), ("vcpo", 4, 7)}  # VCPO's last two seeds at k=4 still to run
    rows = [r for r in rows if (r[0], r[2], r[3]) not in late]
    report = write(_cells(rows), tmp_path / "k_sweep.json", quiet=True)
    assert report["missing_heldout"]["4"] == {"vcpo": [6, 7]}
    md = (tmp_path / "k_sweep.md").read_text()
    assert "  - k=4: VCPO seeds 6,7 (2 runs)\n" in md
    assert "  - k=16: every method, seeds 3,4,5,6,7 (35 runs)\n" in md
    assert sum(map(len, report["missing_heldout"].get("16", {}).values())) == 5 * len(ks.METHODS)


_GAP = re.compile(r"by (\d+\.\d+) ± (\d+\.\d+) \((\d+\.\d) SE; (separated|not separated)\)")


def test_vcpo_is_set_against_every_method_where_both_have_all_seeds_and_the_words_follow_the_numbers(
    tmp_path: Path,
) -> None:
    rows = _selection(BEST) + _heldout(8, {"vcpo": [0.60, 0.61, 0.62, 0.60, 0.61],
                                           "tis": [0.50, 0.52, 0.49, 0.51, 0.50],  # far below: VCPO ahead
                                           "mis": [0.61, 0.59, 0.62, 0.60, 0.61],  # level: not separated
                                           "opob": [0.70, 0.71, 0.72, 0.70, 0.71]})  # fmt: skip  # above: behind
    rows += [
        ("m2po", BEST["m2po"], 8, s, 0.5) for s in ks.HELDOUT_SEEDS[:3]
    ]  # 3 of 5 seeds: not compared yet
    report = write(_cells(rows), tmp_path / "k_sweep2.json", quiet=True)
    vs = report["vcpo_vs"]
    for m, word in (("tis", "ahead"), ("mis", "not separated"), ("opob", "behind")):
        c = vs[m]["8"]
        v, b = (report["heldout"][x]["8"] for x in ("vcpo", m))
        assert c["difference"] == pytest.approx(v["mean"] - b["mean"], abs=1e-12)  # float sums of 5 values
        assert c["se"] == pytest.approx(math.hypot(v["se"], b["se"]), abs=1e-12)
        assert c["separated"] == (abs(c["difference"]) > SEPARATION * c["se"])
        row = next(x for x in (tmp_path / "k_sweep2.md").read_text().splitlines()
                   if x.startswith(f"| {LABEL[m]} |") and " SE; " in x)  # fmt: skip
        assert (
            f"{c['difference']:+.2f} ± {c['se']:.2f} ({abs(c['difference']) / c['se']:.1f} SE; {word})" in row
        )
        a = c["auc"]  # these runs' curves are a line from 0.1 to the final: the AUC gap is half the final's
        assert a["difference"] == pytest.approx(v["auc"]["mean"] - b["auc"]["mean"], abs=1e-12)
        assert a["se"] == pytest.approx(math.hypot(v["auc"]["se"], b["auc"]["se"]), abs=1e-12)
        assert (a["difference"], a["se"], a["separated"]) == pytest.approx(
            (c["difference"] / 2, c["se"] / 2, c["separated"])
        )
        md = (tmp_path / "k_sweep2.md").read_text().split("| VCPO minus (AUC) |")[1]
        row = next(x for x in md.splitlines() if x.startswith(f"| {LABEL[m]} |"))
        assert (
            f"{a['difference']:+.2f} ± {a['se']:.2f} ({abs(a['difference']) / a['se']:.1f} SE; {word})" in row
        )
    assert "8" not in vs["m2po"] and "0" not in vs["tis"]


def _says(gap: tuple[str, str, str, str], d: float, se: float) -> None:
    """A worded gap ('by 0.05 ± 0.02 (2.5 SE; separated)') against the file's unrounded numbers."""
    assert (float(gap[0]), float(gap[1])) == (round(abs(d), 2), round(se, 2))
    assert gap[3] == ("separated" if abs(d) >= SEPARATION * se else "not separated")


@pytest.mark.parametrize("results", [RESULTS, RESULTS.with_name("k_sweep2.json")], ids=lambda p: p.stem)
def test_the_committed_results_verdict_is_the_one_its_json_gives_and_its_words_match_the_numbers(
    results: Path,
) -> None:
    """benchmarks/results/stress/k_sweep.md (and the second sweep's k_sweep2.md) says what its json says: its
    verdict lines are the ones the summary gives; 'ahead' exactly where VCPO has the highest held-out mean and
    leads the second by 2 SE of the difference or more, 'behind' exactly where the best leads VCPO by that much,
    'level' otherwise; 'separated' exactly where a gap is at least 2 SE of the difference."""
    report = json.loads(results.read_text())
    md = results.with_suffix(".md").read_text()
    lines = verdict_lines(report["summary"])
    assert "## Verdict\n\n" + "\n".join(lines) + "\n" in md
    for line in lines:
        k = re.match(r"- k=(\d+):", line).group(1)
        s = report["summary"][k]
        if "vcpo_side" not in s:
            continue
        means = {m: c[k]["mean"] for m, c in report["heldout"].items() if c[k]["n"] == len(ks.HELDOUT_SEEDS)}
        best = means["vcpo"] == max(means.values())
        assert s["vcpo_best"] == best
        gap, se = (s["lead"], s["lead_se"]) if best else (s["vcpo_minus_best"], s["vcpo_minus_best_se"])
        side = "level" if not se or abs(gap) < SEPARATION * se else "ahead" if best else "behind"
        other = LABEL[s["second"] if best else s["best"]]
        assert line.startswith(f"- k={k}: VCPO is " + (f"{side} {other}:" if side == "behind" else
                               f"{side}:" if side == "ahead" else f"level with {other}:"))  # fmt: skip
        if se:
            _says(_GAP.findall(line)[0], gap, se)


def test_a_cell_with_some_of_its_heldout_seeds_is_shown_with_its_count_and_not_ranked(tmp_path: Path) -> None:
    """TIS with two of five seeds, both above VCPO's five: VCPO stays the best, the verdict names TIS as under
    way, the table gives its mean with '(2/5)'; once its five seeds are in, TIS is ranked and ahead."""
    rows = _selection(BEST) + _heldout(16, {"vcpo": [0.40, 0.41, 0.39, 0.42, 0.38], "m2po": [0.30] * 5})
    partial = rows + [("tis", BEST["tis"], 16, s, 0.9) for s in ks.HELDOUT_SEEDS[:2]]
    report = write(_cells(partial), tmp_path / "k_sweep.json", quiet=True)
    s16 = report["summary"]["16"]
    assert (s16["best"], s16["second"], s16["partial"]) == ("vcpo", "m2po", {"tis": 2})
    line = next(x for x in verdict_lines(report["summary"]) if x.startswith("- k=16:"))
    assert (
        line.startswith("- k=16: VCPO is ahead")
        and "Not ranked until all their seeds are in: TIS (seq) 2/5." in line
    )
    assert "0.90 ± 0.00 (2/5)" in (tmp_path / "k_sweep.md").read_text()
    full = rows + [("tis", BEST["tis"], 16, s, 0.9) for s in ks.HELDOUT_SEEDS]
    s16 = write(_cells(full), tmp_path / "k_sweep.json", quiet=True)["summary"]["16"]
    assert (s16["best"], s16["vcpo_best"], s16["partial"]) == ("tis", False, {})


def test_the_docs_give_the_sweeps_verdict_and_vcpo_against_each_method_at_the_lags_measured_and_say_when_done(
    tmp_path: Path,
) -> None:
    """scripts/docs/figures.py's lines for a sweep (README and the study page): every lag not measured yet while no
    lag has all held-out seeds of a method; then that lag's verdict line and VCPO against each method, as the report
    words them, with the runs still to go; "the sweep complete" once nothing is."""
    from scripts.docs.figures import _k_sweep_lines

    rows = _selection(BEST) + [("vcpo", BEST["vcpo"], 0, s, 0.5) for s in ks.HELDOUT_SEEDS[:3]]
    lines = _k_sweep_lines(write(_cells(rows), tmp_path / "k_sweep2.json", quiet=True))
    assert [x for x in lines if x.startswith("- ")] == [
        "- k=0: not measured yet. Under way: VCPO 3/5.",
        "- not measured yet: k=4, 8, 16, 32, 64.",
    ]
    rows += _heldout(0, {"vcpo": [0.50] * 5, "plain": [0.40, 0.41, 0.39, 0.42, 0.38]})
    report = write(_cells(rows), tmp_path / "k_sweep2.json", quiet=True)
    lines = _k_sweep_lines(report)
    (k0,) = [x for x in verdict_lines(report["summary"]) if x.startswith("- k=0:")]
    assert k0.startswith("- k=0: VCPO is ahead") and k0 in lines
    # the ESS lr alone's k=0 runs are plain's at its lr, BEST's 1e-4 for both
    gap = "(+0.10 ± 0.01, 14.1 SE)"
    assert f"- k=0: VCPO is ahead of plain REINFORCE {gap}, ESS lr alone {gap}." in lines
    assert not any(x.startswith("- k=4:") for x in lines), "an unmeasured lag has no verdict line"
    left = sum(map(len, report["missing"].values()))
    assert f"({len(report['cells'])} runs so far, {left} planned still to run)" in lines[0]
    for k in ks.LAGS:
        rows += _heldout(k, {m: [0.5, 0.6, 0.5, 0.6, 0.5] for m in ks.METHODS})
    rows += [(m, lr, 0, s, 0.5) for m, lr, s in ks.CALIBRATE]
    lines = _k_sweep_lines(write(_cells(rows), tmp_path / "k_sweep2.json", quiet=True))
    assert ", the sweep complete)" in lines[0] and "not measured yet" not in "".join(lines)


def test_a_chosen_lr_at_either_end_of_the_grid_is_named_as_such_and_one_inside_it_is_not(
    tmp_path: Path,
) -> None:
    """BEST puts plain and the ESS lr alone at the lowest lr, M2PO at the highest, the rest inside the grid."""
    sel = write(_cells(_selection(BEST, grown=False)), tmp_path / "k_sweep.json", quiet=True)["selection"]
    assert {m: v["grid_edge"] for m, v in sel.items() if v["grid_edge"]} == {
        "plain": "lowest", "ess_lr": "lowest", "m2po": "highest"}  # fmt: skip
    text = (tmp_path / "k_sweep.md").read_text()
    assert (
        "Chosen at the grid's lowest lr (1e-4): plain REINFORCE, ESS lr alone; their best lr may lie below"
        in text
    )
    assert "Chosen at the grid's highest lr (8e-4): M2PO; their best lr may lie above the grid" in text
    # the runs past those edges made (worse): the choices are inside the grown grids, and no line names them
    sel = write(_cells(_selection(BEST)), tmp_path / "k_sweep.json", quiet=True)["selection"]
    assert sel["plain"]["grid"] == [ks.LRS[0] / 2, *ks.LRS] and sel["m2po"]["grid"] == [
        *ks.LRS,
        ks.LRS[-1] * 2,
    ]
    assert not any(v["grid_edge"] for v in sel.values())
    assert "Chosen at the grid's" not in (tmp_path / "k_sweep.md").read_text()
    inside = dict.fromkeys(ks.METHODS, ks.LRS[1])
    write(_cells(_selection(inside)), tmp_path / "k_sweep.json", quiet=True)
    assert "Chosen at the grid's" not in (tmp_path / "k_sweep.md").read_text()


def test_at_k0_methods_that_are_the_same_runs_are_ranked_once_under_the_method_whose_runs_they_are(
    tmp_path: Path,
) -> None:
    best = dict.fromkeys(ks.METHODS, ks.LRS[0])  # every method at one lr: at k=0 only two sets of runs
    rows = _selection(best) + [
        (m, ks.LRS[0], 0, s, a) for m, a in (("plain", 0.5), ("vcpo", 0.6)) for s in ks.HELDOUT_SEEDS
    ]
    s0 = write(_cells(rows), tmp_path / "k_sweep.json", quiet=True)["summary"]["0"]
    assert (s0["best"], s0["second"], s0["vcpo_best"]) == ("vcpo", "plain", True)
    assert s0["complete"] and s0["methods"] == len(ks.METHODS)


def test_each_planned_run_is_a_valid_recipe_with_its_lag_seed_lr_and_method(tmp_path: Path) -> None:
    """The runner's command line, loaded as agent-rl loads it: every method's overrides validate, the run is
    exactly k stale, and selection runs skip the periodic evals (the choice reads finals only)."""
    from agent_rl.config import load_recipe

    root = Path(__file__).resolve().parents[3]
    runner = ks.Runner(tmp_path, WARM0, recipe=str(root / ks.RECIPE))
    planned = ks.plan("select", {})[: len(ks.METHODS)] + ks.plan("heldout", _cells(_selection(BEST)))[-1:]
    assert {ks.NAME.match(p.name).group(1) for p in planned[:-1]} == set(ks.METHODS)
    for p in planned:
        cmd = runner.train_cmd(p)
        assert cmd[:3] == ["nice", "-n", "15"]
        recipe = load_recipe(cmd[cmd.index("train") + 1], cmd[cmd.index("train") + 3 :: 2])
        assert (recipe.rollout.fixed_lag, recipe.train.seed, recipe.train.steps) == (p.k, p.seed, ks.STEPS)
        assert recipe.run_dir == tmp_path / p.name
        assert recipe.eval.every == (0 if p.part == "select" else ks.EVAL_EVERY)
        method = ks.NAME.match(p.name).group(1)
        assert recipe.algorithm.loss == {
            "plain": "reinforce",
            "tis": "tis_seq",
            "mis": "mis",
            "m2po": "m2po",
        }.get(method, "vcpo")
        assert (recipe.algorithm.ess_lr_rule == "sqrt") == (method in ("vcpo", "ess_lr"))
        assert (recipe.algorithm.advantage == "opob") == (method in ("vcpo", "opob"))
        assert f"learner.lr={recipe.learner.lr:g}" in p.sets


def test_a_first_slice_plans_only_its_methods_and_lags_and_bad_names_are_refused(tmp_path: Path) -> None:
    """`--methods vcpo,m2po --lags 0,8,32,64`: the runs that answer the question soonest, nothing else."""
    sel = ks.plan("select", {}, methods=("vcpo", "m2po"))
    assert {ks.NAME.match(p.name).group(1) for p in sel} == {"vcpo", "m2po"}
    assert len(sel) == 2 * len(ks.LRS) * len(ks.SELECT_SEEDS)
    held = ks.plan("heldout", _cells(_selection(BEST)), methods=("vcpo", "m2po"), lags=(0, 8, 32, 64))
    assert {(ks.NAME.match(p.name).group(1), p.k) for p in held} == {
        (m, k) for m in ("vcpo", "m2po") for k in (0, 8, 32, 64)
    } - {("m2po", 0)} | {("plain", 0)}  # at k=0 M2PO's cell is plain's run at M2PO's lr
    assert len(ks.plan("heldout", _cells(_selection(BEST)))) > len(held)
    with pytest.raises(SystemExit, match=r"--methods 'vcpo,ppo': \['ppo'\] not in plain, tis"):
        ks.main(["plan", "--methods", "vcpo,ppo", "--runs", str(tmp_path), "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match=r"--lags '8,12': \[12\] not in 0, 4, 8"):
        ks.main(["plan", "--lags", "8,12", "--runs", str(tmp_path), "--out", str(tmp_path / "x.json")])


def test_the_warm_start_accuracy_is_read_beside_it_and_a_bad_one_is_named(tmp_path: Path) -> None:
    warm = tmp_path / "tiny_multistep" / "sft"
    warm.mkdir(parents=True)
    assert ks.warm_start_accuracy(warm) is None  # not built yet: `run` builds it first
    (warm.parent / "warm_eval.json").write_text(json.dumps({"accuracy": 0.12, "tasks": 100}))
    assert ks.warm_start_accuracy(warm) == 0.12
    (warm.parent / "warm_eval.json").write_text(json.dumps({"accuracy": None}))
    with pytest.raises(ValueError, match=r"warm_eval.json: field accuracy is None"):
        ks.warm_start_accuracy(warm)
    # a run below its warm start collapsed; one at or above it did not
    assert (
        _cell("vcpo", ks.LRS[0], 8, 3, 0.05).collapsed and not _cell("vcpo", ks.LRS[0], 8, 3, 0.1).collapsed
    )


def _warm_dir(root: Path, acc: float, weights: bytes) -> Path:
    """A warm start as multistep_warm leaves it: the model dir, warm_eval.json beside it."""
    warm = root / "sft"
    warm.mkdir(parents=True)
    (warm / "model.safetensors").write_bytes(weights)
    (root / "warm_eval.json").write_text(json.dumps({"accuracy": acc, "tasks": 100}))
    return warm


def test_runs_from_another_warm_start_are_refused_before_any_starts_with_what_to_do(tmp_path: Path) -> None:
    out = tmp_path / "k_sweep.json"
    first = ks.WarmStart(0.08, None)  # the first sweep's: its weights were never fingerprinted
    write({("plain", ks.LRS[0], 8, 0): ks.Cell("plain", ks.LRS[0], 8, 0, 0.3, ((0, 0.08), (80, 0.3)), (1.0,), 80,
           first.accuracy)}, out, quiet=True)  # fmt: skip
    rebuilt = _warm_dir(tmp_path / "rebuilt", 0.12, b"weights rebuilt on another CPU")
    args = ["--runs", str(tmp_path / "runs"), "--out", str(out), "--warm", str(rebuilt)]
    with pytest.raises(SystemExit, match=r"held-out 0\.12, weights sha256 \w{12}\) is not the one 1 runs kept in "
                       r".*k_sweep.json started from \(held-out 0\.08, weights not fingerprinted\): one sweep, one "
                       r"warm start\. Name that warm start with --warm, or .* --out NEW\.json --runs NEW_DIR"):  # fmt: skip
        ks.main(["run", *args])
    with pytest.raises(SystemExit, match="is not the one 1 runs kept"):
        ks.main(["plan", *args])
    typo = ["--runs", str(tmp_path / "runs"), "--out", str(out), "--warm", str(tmp_path / "rebuilt" / "stf")]
    with pytest.raises(SystemExit, match=r"no warm start at .*stf, and 1 runs kept in .*k_sweep.json started from "
                       r"one \(held-out 0\.08, weights not fingerprinted\): name it with --warm"):  # fmt: skip
        ks.main(["run", *typo])  # not a new build first (minutes), to be refused after it
    assert not (tmp_path / "runs").exists() and not (tmp_path / "rebuilt" / "stf").exists()  # nothing started
    # fingerprinted: the same accuracy from other weights is another warm start; the same weights are the same
    kept = ks.WarmStart(0.12, ks.weights_sha256(rebuilt))
    cells = {("plain", ks.LRS[0], 8, 0): ks.Cell("plain", ks.LRS[0], 8, 0, 0.3, ((0, 0.12),), (1.0,), 80, 0.12,
             kept.sha256)}  # fmt: skip
    ks.check_same_warm_start(cells, kept, "here", out)
    with pytest.raises(SystemExit, match="is not the one 1 runs kept"):
        ks.check_same_warm_start(cells, ks.WarmStart(0.12, "b" * 64), "here", out)
    assert first.same_as(ks.WarmStart(0.08, kept.sha256))  # unfingerprinted: only the accuracy can tell


def test_a_finished_run_records_its_warm_start_and_is_read_with_it_and_a_report_never_mixes_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    p = ks.Planned(ks.run_name("vcpo", ks.LRS[0], 8, 0), "select", "vcpo", 8, 0, ())
    d = _finish(runs, "vcpo", ks.LRS[0], 8, 0, acc=0.5)  # trained, its final eval not yet written:
    (d / "final_eval.json").unlink()
    (d / "checkpoints" / "latest").mkdir(parents=True)

    def score(run: Path) -> str:  # the final eval (a real one needs a trained model): what it leaves behind
        (run / "final_eval.json").write_text(json.dumps({"accuracy": 0.5, "tasks": 100, "seed": 0}))
        return "scored"

    monkeypatch.setattr(ks.final_eval, "evaluate", score)
    assert ks.Runner(runs, WARM0)(p) == "scored"
    assert json.loads((d / ks.WARM_RECORD).read_text()) == {"accuracy": 0.1, "sha256": "a" * 64}
    (cell,) = ks.read_cells(runs, warm_start=ks.WarmStart(0.3, "c" * 64)).values()  # its record wins
    assert cell.warm_start == WARM0 and cell.curve[0] == (0, 0.1)
    other = _finish(tmp_path / "other", "vcpo", ks.LRS[1], 8, 0, acc=0.5)
    (other / ks.WARM_RECORD).write_text(json.dumps({"accuracy": 0.1, "sha256": "b" * 64}))
    cells = ks.read_cells(runs, warm_start=WARM0) | ks.read_cells(tmp_path / "other", warm_start=WARM0)
    with pytest.raises(ValueError, match=r"runs from different warm starts \(held-out 0\.10, weights sha256 "
                       r"aaaaaaaaaaaa; held-out 0\.10, weights sha256 bbbbbbbbbbbb\): one sweep, one warm start"):  # fmt: skip
        write(cells, tmp_path / "out.json", quiet=True)
    report = write(ks.read_cells(runs, warm_start=WARM0), tmp_path / "out.json", quiet=True)
    assert report["design"]["warm_sha256"] == "a" * 64 and report["cells"][0]["warm_sha256"] == "a" * 64


def test_the_kept_warm_start_is_the_one_the_second_sweeps_runs_started_from() -> None:
    warm = ks.load_warm_start(ROOT / ks.WARM)
    assert warm is not None, f"{ks.WARM}: the sweep's warm start is missing from the repository"
    source = (ROOT / ks.WARM).parent / "SOURCE.md"
    assert warm.sha256 in source.read_text(), f"{source} names other weights than {ks.WARM} holds"
    second = ROOT / ks.OUT
    if second.is_file():
        cells = json.loads(second.read_text())["cells"]
        assert {(c["warm"], c["warm_sha256"]) for c in cells} <= {(warm.accuracy, warm.sha256)}


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from Linux /proc")
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_killing_the_sweep_stops_the_runs_it_was_training(tmp_path: Path, sigint: str) -> None:
    """The runs stop on the SIGINT the sweep sends them, also when the sweep was started with SIGINT ignored
    (`nohup ... &` from a script), which its runs would inherit."""
    warm = _warm_dir(tmp_path / "warm", 0.12, b"weights")
    # the training command stands in for `agent-rl train` (minutes per run): a process that trains until stopped
    script = (
        "import sys\nfrom benchmarks.stress import k_sweep as ks\n"
        "ks.Runner.train_cmd = lambda self, p: [sys.executable, '-c', 'import time; time.sleep(3600)']\n"
        f"ks.main(['run', 'select', '--methods', 'vcpo', '--jobs', '2', '--runs', {str(tmp_path / 'runs')!r}, "
        f"'--out', {str(tmp_path / 'out.json')!r}, '--warm', {str(warm)!r}])\n"
    )
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
    sweep = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, preexec_fn=ignore)  # fmt: skip
    training: set[int] = set()
    try:
        assert [sweep.stdout.readline().split()[0] for _ in range(2)] == ["start", "start"]
        deadline = time.monotonic() + 120  # bounds a hung test; no timing claim: the runs start at once
        while len(training := tree(sweep.pid) - {sweep.pid}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(training) == 2, f"the sweep did not start its two runs (its children: {training})"
        sweep.send_signal(signal.SIGTERM)
        try:  # the sweep waits up to STOP_WAIT_S for each run: more than that is a run that did not stop
            out = sweep.communicate(timeout=2 * ks.STOP_WAIT_S + 60)[0]
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"the sweep did not exit after SIGTERM; its output: {e.output!r}") from None
    finally:
        sweep.kill()
        left = {pid for pid in training if alive(pid)}
        for pid in left:  # left by a sweep that did not stop them: no stray process after the test
            os.kill(pid, signal.SIGKILL)
    assert sweep.returncode != 0 and "k_sweep: stopped by signal 15" in out
    assert "did not stop on SIGINT" not in out, out
    assert not left, "a run went on training after the sweep was killed"


# stands in for `agent-rl train` (minutes per run): writes a trained run's step record, then waits for a file
_TRAIN_UNTIL_RELEASED = (
    "import json, os, sys, time\n"
    "os.makedirs(sys.argv[1], exist_ok=True)\n"
    "open(os.path.join(sys.argv[1], 'metrics.jsonl'), 'w').write(json.dumps({'step': 79, 'vcpo/ess_ratio': 1.0}))\n"
    "while not os.path.exists(sys.argv[2]):\n    time.sleep(0.05)\n"
)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from Linux /proc")
def test_sigusr1_starts_no_new_run_and_the_sweep_exits_once_the_runs_training_finish(tmp_path: Path) -> None:
    warm = _warm_dir(tmp_path / "warm", 0.12, b"weights")
    runs, release = tmp_path / "runs", tmp_path / "release"
    script = (
        "import json, sys\nfrom benchmarks.stress import k_sweep as ks\n"
        f"ks.Runner.train_cmd = lambda self, p: [sys.executable, '-c', {_TRAIN_UNTIL_RELEASED!r}, "
        f"str(self.runs / p.name), {str(release)!r}]\n"
        "def score(run):  # the final eval (a real one needs a trained model): what it leaves behind\n"
        "    ks.final_eval.write(run, 0.5, 100, 0)\n"
        "    return f'{run.name}: scored'\n"
        "ks.final_eval.evaluate = score\n"
        f"ks.main(['run', 'select', '--methods', 'vcpo', '--jobs', '2', '--runs', {str(runs)!r}, "
        f"'--out', {str(tmp_path / 'out.json')!r}, '--warm', {str(warm)!r}])\n"
    )
    sweep = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    training: set[int] = set()
    try:
        started = [sweep.stdout.readline() for _ in range(2)]
        assert [line.split()[0] for line in started] == ["start", "start"], started
        deadline = time.monotonic() + 120  # bounds a hung test; no timing claim: the runs start at once
        while len(training := tree(sweep.pid) - {sweep.pid}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(training) == 2, f"the sweep did not start its two runs (its children: {training})"
        sweep.send_signal(signal.SIGUSR1)
        assert (
            "SIGUSR1: starting no new run" in sweep.stdout.readline()
        )  # handled: no run can start from here on
        release.touch()  # the two runs finish their training
        out = sweep.communicate(timeout=120)[0]
    finally:
        sweep.kill()
        for pid in training:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert sweep.returncode == 0, out
    assert "start " not in out, f"a run started after SIGUSR1: {out}"
    assert out.count(": scored") == 2 and "no run started after SIGUSR1 or --stop-starting-after" in out, out
    finished = sorted(d.name for d in runs.iterdir() if (d / "final_eval.json").is_file())
    assert finished == sorted(line.split()[1] for line in started)
    assert f"k_sweep: {len(ks.plan_all({})) - 2} runs missing" in out  # the whole sweep's, 2 of them run


def test_stop_starting_after_0_starts_nothing_and_a_bad_value_is_named(tmp_path: Path) -> None:
    warm = _warm_dir(tmp_path / "warm", 0.12, b"weights")
    args = ["run", "select", "--methods", "vcpo", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "o.json"),
            "--warm", str(warm)]  # fmt: skip
    for bad in ("-1", "nan"):
        with pytest.raises(SystemExit, match=rf"--stop-starting-after {bad}: give the minutes, 0 or more"):
            ks.main([*args, "--stop-starting-after", bad])
    sweep = subprocess.run([sys.executable, "-m", "benchmarks.stress.k_sweep", *args, "--stop-starting-after", "0"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert "start " not in sweep.stdout and not (tmp_path / "runs").exists()
    assert (
        f"k_sweep: {len(ks.plan_all({}))} runs missing" in sweep.stdout
        and "--stop-starting-after" in sweep.stdout
    )


def test_a_best_lr_at_the_grids_edge_grows_the_grid_past_it_before_the_heldout_runs_start() -> None:
    lo, hi = ks.LRS[0], ks.LRS[-1]
    rows = _selection(
        dict(BEST, vcpo=lo, plain=hi), grown=False
    )  # VCPO best at the lowest lr, plain at the highest
    sel = ks.select(_cells(rows), "vcpo")
    assert (sel.grid, sel.chosen, sel.done) == ((lo / 2, *ks.LRS), lo, False)
    planned = {p.name for p in ks.plan("select", _cells(rows))}
    assert {ks.run_name("vcpo", lo / 2, 8, s) for s in ks.SELECT_SEEDS} <= planned
    assert {ks.run_name("plain", hi * 2, 8, s) for s in ks.SELECT_SEEDS} <= planned
    vcpo_at = f"ksweep_vcpo_lr{lo:g}_"  # (OPOB alone's k=0 runs are VCPO's at OPOB's lr, 2e-4)
    assert not any(p.name.startswith(vcpo_at) for p in ks.plan("heldout", _cells(rows)))  # waits for the grid
    # half the lowest did better still: the grid grows again, down to its bound, where the choice stays
    rows += [("vcpo", lo / 2, 8, s, 0.7) for s in ks.SELECT_SEEDS]
    assert ks.select(_cells(rows), "vcpo").grid == (lo / 4, lo / 2, *ks.LRS)
    rows += [("vcpo", lo / 4, 8, s, 0.8) for s in ks.SELECT_SEEDS]
    assert lo / 8 < ks.LR_BOUNDS[0] <= lo / 4
    sel = ks.select(_cells(rows), "vcpo")
    assert (sel.chosen, sel.done) == (lo / 4, True)
    assert any(p.name == ks.run_name("vcpo", lo / 4, 8, 3) for p in ks.plan("heldout", _cells(rows)))
    # twice the highest did worse: the choice is inside the grown grid; a tie goes to the lower lr
    rows += [("plain", hi * 2, 8, s, 0.6) for s in ks.SELECT_SEEDS]
    sel = ks.select(_cells(rows), "plain")
    assert (sel.grid, sel.chosen, sel.done) == ((*ks.LRS, hi * 2), hi, True)
