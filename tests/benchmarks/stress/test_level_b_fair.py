"""The lr-matched level (b) study's planning and report logic, on hand-made run records (no training)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from benchmarks.stress.level_b_fair import (
    BASELINES,
    HELDOUT_SEEDS,
    LRS,
    RECIPE_LR,
    SELECT_SEEDS,
    Cell,
    main,
    plan,
    read_cells,
    run_name,
    select_lrs,
)  # fmt: skip
from benchmarks.stress.level_b_fair_report import write


def _finish(runs: Path, method: str, lr: float, k: int, seed: int, acc: float) -> None:
    """A run as the runner leaves it: its dir with final_eval.json."""
    d = runs / run_name(method, lr, k, seed)
    d.mkdir(parents=True)
    (d / "final_eval.json").write_text(json.dumps({"accuracy": acc, "tasks": 100, "seed": seed}))


def _cells(rows: list[tuple[str, float, int, int, float]]) -> dict[tuple, Cell]:
    return {(m, lr, k, s): Cell(m, lr, k, s, a) for m, lr, k, s, a in rows}


def _selection(best: dict[str, float]) -> list[tuple]:
    """Every baseline at every lr on the selection seeds at k=4; `best[m]` scores 0.7, the others 0.4."""
    return [
        (m, lr, 4, s, 0.7 if lr == best[m] else 0.4) for m in BASELINES for lr in LRS for s in SELECT_SEEDS
    ]


def test_the_lr_is_chosen_on_the_selection_seeds_only() -> None:
    best = {"plain": LRS[0], "tis": LRS[1], "mis": LRS[2], "m2po": LRS[1]}
    rows = _selection(best)
    # held-out seeds at k=4 that would pick another lr for every method if they were read
    rows += [
        (m, lr, 4, s, 0.99 if lr != best[m] else 0.0) for m in BASELINES for lr in LRS for s in HELDOUT_SEEDS
    ]
    assert select_lrs(_cells(rows)) == best


def test_a_method_with_a_selection_seed_missing_has_no_lr_yet() -> None:
    rows = [
        r
        for r in _selection(dict.fromkeys(BASELINES, LRS[0]))
        if not (r[0] == "tis" and r[1] == LRS[2] and r[3] == 2)
    ]
    chosen = select_lrs(_cells(rows))
    assert chosen["tis"] is None and chosen["plain"] == LRS[0]
    names = [p.name for p in plan("heldout", _cells(rows))]
    assert not any("_tis_" in n for n in names) and any("_mis_" in n for n in names)


def test_summary_picks_the_best_baseline_at_its_lr_and_the_difference_has_the_two_cells_standard_error(
    tmp_path: Path,
) -> None:
    best = {"plain": LRS[0], "tis": LRS[1], "mis": LRS[1], "m2po": LRS[2]}
    rows = _selection(best)
    mis = [0.50, 0.60, 0.55, 0.65, 0.45]
    vcpo = [0.70, 0.72, 0.60, 0.75, 0.68]
    for i, s in enumerate(HELDOUT_SEEDS):
        rows += [("plain", LRS[0], 4, s, 0.30), ("tis", LRS[1], 4, s, 0.40), ("m2po", LRS[2], 4, s, 0.35)]
        rows += [("mis", LRS[1], 4, s, mis[i]), ("vcpo", RECIPE_LR, 4, s, vcpo[i])]
        rows += [
            ("mis", LRS[0], 4, s, 0.95)
        ]  # mis at an lr it was not chosen at: never the baseline's number
    report = write(_cells(rows), tmp_path / "level_b_fair.json")
    s = report["summary"]["4"]
    assert (s["best_baseline"], s["best_baseline_lr"]) == ("mis", LRS[1])
    se = math.sqrt(statistics.variance(mis) / 5 + statistics.variance(vcpo) / 5)
    assert s["vcpo_minus_best_baseline"] == pytest.approx(statistics.mean(vcpo) - statistics.mean(mis))
    assert s["vcpo_minus_best_baseline_se"] == pytest.approx(se)
    assert s["complete"] is True
    assert (
        report["summary"]["8"]["vcpo_minus_best_baseline"] is None
        and report["summary"]["8"]["complete"] is False
    )
    on_disk = json.loads((tmp_path / "level_b_fair.json").read_text())
    cell = on_disk["cells"][0]
    assert set(cell) == {"method", "lr", "k", "seed", "final_accuracy", "collapsed"}
    assert {
        "best_baseline",
        "best_baseline_lr",
        "vcpo_minus_best_baseline",
        "vcpo_minus_best_baseline_se",
    } <= set(on_disk["summary"]["4"])


def test_k0_cells_of_methods_that_make_plains_or_vcpos_update_are_those_runs() -> None:
    rows = [("plain", LRS[0], 0, s, 0.5) for s in HELDOUT_SEEDS] + [
        ("vcpo", LRS[0], 0, s, 0.6) for s in HELDOUT_SEEDS
    ]
    names = [p.name for p in plan("ablate", _cells(rows))]
    assert not any(
        f"_lr{LRS[0]:g}_k0_" in n for n in names
    )  # ess_lr -> plain's runs, opob -> vcpo's: all done
    assert run_name("vcpo", LRS[1], 0, 3) in names and not any(
        n.startswith("stress_f_ess_lr") and "_k0_" in n for n in names
    )


def test_plan_skips_finished_runs_and_cells_an_earlier_report_kept(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "out" / "level_b_fair.json"
    _finish(runs, "plain", LRS[0], 4, 0, 0.5)
    (runs / run_name("tis", LRS[0], 4, 0)).mkdir(parents=True)  # started, never evaluated: still to run
    write(read_cells(runs), out)
    # a later session: the run dirs are gone; the report's cells still count
    later = tmp_path / "later"
    _finish(later, "mis", LRS[0], 4, 0, 0.6)
    cells = read_cells(later, out)
    names = [p.name for p in plan("select", cells)]
    assert run_name("plain", LRS[0], 4, 0) not in names and run_name("mis", LRS[0], 4, 0) not in names
    assert names[0] == run_name("tis", LRS[0], 4, 0) and len(names) == 3 * 4 * 3 - 2


def test_a_run_dir_wins_over_the_kept_copy_and_the_report_marks_missing_cells(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "level_b_fair.json"
    _finish(runs, "vcpo", RECIPE_LR, 4, 3, 0.2)
    write(read_cells(runs), out)
    rerun = tmp_path / "rerun"
    _finish(rerun, "vcpo", RECIPE_LR, 4, 3, 0.7)
    report = write(read_cells(rerun, out), out)
    assert [c["final_accuracy"] for c in report["cells"]] == [0.7]
    md = out.with_suffix(".md").read_text()
    assert "0.70 (1/5)" in md  # a partial cell says how many held-out seeds it has
    assert "| 8 | missing |" in md
    assert "`benchmarks/stress/level_b_fair.sh select`: 36 runs to go" in md
    assert out.with_suffix(".png").is_file()


def test_a_collapsed_run_is_one_that_ends_below_the_warm_start() -> None:
    assert Cell("plain", LRS[2], 8, 3, 0.1).row()["collapsed"] is True
    assert Cell("plain", LRS[2], 8, 3, 0.3).row()["collapsed"] is False


def test_bad_input_names_the_file_and_the_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _finish(tmp_path, "plain", LRS[0], 4, 0, float("nan"))
    with pytest.raises(ValueError, match=r"final_eval.json: field accuracy is nan"):
        read_cells(tmp_path)
    with pytest.raises(SystemExit, match="part 'bogus' is not one of select, heldout, fill, ablate"):
        main(["plan", "bogus", "--runs", str(tmp_path / "none"), "--out", str(tmp_path / "x.json")])


def test_fill_plans_vcpo_at_each_ks_best_baseline_lr_and_each_part_at_the_recipe_lr() -> None:
    """Issue 39: the verdict table's cells for every k; here M2PO (5e-5) is the best baseline at k=8 and TIS
    (1.5e-4) at k=4, so VCPO runs at 5e-5 for k=8 and at 1.5e-4 for k=4."""
    best = {"plain": LRS[1], "tis": LRS[1], "mis": LRS[1], "m2po": LRS[0]}
    rows = _selection(best)
    for s in HELDOUT_SEEDS:
        rows += [("plain", LRS[1], 4, s, 0.5), ("tis", LRS[1], 4, s, 0.7), ("m2po", LRS[0], 4, s, 0.6)]
        rows += [("plain", LRS[1], 8, s, 0.5), ("tis", LRS[1], 8, s, 0.6), ("m2po", LRS[0], 8, s, 0.7)]
        rows += [("vcpo", LRS[1], 4, s, 0.7), ("opob", RECIPE_LR, 4, s, 0.7)]  # already run
    names = {p.name for p in plan("fill", _cells(rows))}
    want = {run_name("vcpo", LRS[0], 8, s) for s in HELDOUT_SEEDS}
    want |= {run_name("ess_lr", RECIPE_LR, k, s) for k in (4, 8) for s in HELDOUT_SEEDS}
    want |= {run_name("opob", RECIPE_LR, 8, s) for s in HELDOUT_SEEDS}
    # k=0: ESS lr alone is plain's run, OPOB alone VCPO's; no baseline measured at k=0 yet, so no VCPO pick
    want |= {run_name(m, RECIPE_LR, 0, s) for m in ("plain", "vcpo") for s in HELDOUT_SEEDS}
    assert names == want


# stands in for `agent-rl train` (minutes per run): a trained run's last step record and checkpoint, then exits
_TRAIN = (
    "import json, os, sys\n"
    "os.makedirs(os.path.join(sys.argv[1], 'checkpoints', 'latest'), exist_ok=True)\n"
    "open(os.path.join(sys.argv[1], 'metrics.jsonl'), 'w').write(json.dumps({'step': 39}))\n"
)


@pytest.mark.slow  # 36 runs' processes and 18 reports with their figure: ~25 s on the 2-core machine
def test_run_trains_scores_and_reports_every_planned_run_and_its_command_is_the_studys_recipe(
    tmp_path: Path,
) -> None:
    """`level_b_fair run select` (the runner that replaced the shell loop): every planned run trained in its own
    process, scored, its checkpoints dropped, the report rewritten with every cell and each lr chosen; the real
    command is recipes/tiny_tir.yaml from the warm start, exactly k stale, 40 steps, no periodic eval, void masking off,
    the method's overrides."""
    import subprocess
    import sys

    from agent_rl.config import load_recipe
    from benchmarks.stress import level_b_fair as lb
    from benchmarks.stress.scored_run import Runner

    root = Path(__file__).resolve().parents[3]
    warm, runs, out = tmp_path / "warm", tmp_path / "runs", tmp_path / "out" / "level_b_fair.json"
    warm.mkdir()
    (warm / "model.safetensors").write_bytes(b"weights")
    script = (
        "import json, sys\nfrom benchmarks.stress import level_b_fair as lb, scored_run\n"
        f"scored_run.Runner.train_cmd = lambda self, p: [sys.executable, '-c', {_TRAIN!r}, str(self.runs / p.name)]\n"
        "def score(run):  # the final eval (a real one needs a trained model): what it leaves behind\n"
        "    acc = 0.7 if '_lr0.00015_' in run.name else 0.4\n"
        "    scored_run.final_eval.write(run, acc, 100, 0)\n"
        "    return f'{run.name}: scored'\n"
        "scored_run.final_eval.evaluate = score\n"
        f"lb.main(['run', 'select', '--jobs', '2', '--runs', {str(runs)!r}, '--out', {str(out)!r}, '--warm', {str(warm)!r}])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "level_b_fair select: 0 runs missing" in done.stdout, done.stdout
    report = json.loads(out.read_text())
    assert len(report["cells"]) == len(BASELINES) * len(LRS) * len(SELECT_SEEDS)
    assert {m: v["chosen_lr"] for m, v in report["selection"].items()} == dict.fromkeys(BASELINES, 1.5e-4)
    assert report["meta"]["cpu"]["cores"] and len(report["meta"]["load_before"]) == 3  # the run's provenance
    lb.main(["report", "--runs", str(runs), "--out", str(out)])  # a later report keeps it
    assert json.loads(out.read_text())["meta"] == report["meta"]
    assert not any((d / "checkpoints").exists() for d in runs.iterdir() if d.is_dir())
    assert "`benchmarks/stress/level_b_fair.sh select`: 0 runs to go" in out.with_suffix(".md").read_text()
    runner = Runner(tmp_path, None, str(root / lb.RECIPE), str(warm), lb.STEPS, eval_every=0)
    for p in [lb.plan("select", {})[0], *lb.plan("ablate", {})[:1]]:
        cmd = runner.train_cmd(p)
        recipe = load_recipe(cmd[cmd.index("train") + 1], cmd[cmd.index("train") + 3 :: 2])
        assert (recipe.rollout.fixed_lag, recipe.train.seed, recipe.train.steps) == (p.k, p.seed, 40)
        assert (
            recipe.eval.every == 0
            and recipe.buffer.mask_void is False
            and str(recipe.model.path) == str(warm)
        )
        assert recipe.algorithm.loss == ("reinforce" if p.method == "plain" else "vcpo")
        assert (
            recipe.learner.lr == float(lb.NAME.match(p.name).group(2)) and recipe.run_dir == tmp_path / p.name
        )
    with pytest.raises(SystemExit, match="no warm start at"):
        lb.main(["run", "select", "--runs", str(runs), "--out", str(out), "--warm", str(tmp_path / "none")])
