"""benchmarks/harness: the run order, resume after a kill, the drained time limit, the tuning pass, the statistics
against hand computations and the words the 2-SE rule allows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.harness import cores, provenance, report, runner, stats

ROOT = Path(__file__).resolve().parents[2]


def test_plan_interleaves_seeds_and_rotates_the_cells():
    order = [(j.cell, j.seed) for j in runner.plan(["A", "B", "C"], [0, 1, 2, 3])]
    assert order == [("A", 0), ("B", 0), ("C", 0), ("B", 1), ("C", 1), ("A", 1),
                     ("C", 2), ("A", 2), ("B", 2), ("A", 3), ("B", 3), ("C", 3)]  # fmt: skip
    assert [j.cell for j in runner.plan(["A", "B"], [0, 1], rotate=False)] == ["A", "B", "A", "B"]


def test_time_limit_drains_and_the_next_invocation_resumes(tmp_path):
    now = [0.0]
    ran = []

    def fn(job):
        ran.append(job.key)
        now[0] += 10  # each run takes 10 "seconds" on the fake clock
        return {"value": job.seed}

    jobs = runner.plan(["A", "B"], [0, 1])
    out = runner.Runner(tmp_path, time_limit_s=15, clock=lambda: now[0]).run(jobs, fn, log=lambda _: None)
    # the run that started before the limit finished and was recorded; none started after it
    assert ran == ["A@0", "B@0"] and [j.key for j in out.missing] == ["B@1", "A@1"]
    assert [json.loads(x)["cell"] for x in (tmp_path / "runs.jsonl").read_text().splitlines()] == ["A", "B"]
    out = runner.Runner(tmp_path).run(jobs, fn, log=lambda _: None)
    assert ran == ["A@0", "B@0", "B@1", "A@1"] and not out.missing
    assert [(r["cell"], r["seed"]) for r in out.records] == [("A", 0), ("B", 0), ("B", 1), ("A", 1)]


SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from benchmarks.harness import runner
    work, gate = Path(sys.argv[1]), Path(sys.argv[2])
    def fn(job):
        if job.key == "B@0":  # the second run blocks until the test has killed the process
            gate.write_text("started")
            while True:
                time.sleep(0.05)
        return {"ran_in": sys.argv[3]}
    runner.Runner(work).run(runner.plan(["A", "B", "C"], [0]), fn, log=lambda _: None)
    """
)


def test_resume_after_a_kill_reruns_only_the_unfinished_cells(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(SCRIPT)
    gate, work = tmp_path / "gate", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(work), str(gate), "first"], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not gate.exists():  # wait for the event: B@0 has started (A@0 is recorded before it)
            assert proc.poll() is None and time.monotonic() < deadline, "the benchmark never reached B@0"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list(runner.read_runs(work / "runs.jsonl")) == ["A@0"]
    with (work / "runs.jsonl").open("a") as f:
        f.write('{"cell": "B", "se')  # a line cut by the kill is ignored
    ran = []
    out = runner.Runner(work).run(runner.plan(["A", "B", "C"], [0]), lambda j: ran.append(j.key) or {"ran_in": "second"},
                                  log=lambda _: None)  # fmt: skip
    assert ran == ["B@0", "C@0"]
    assert [r["ran_in"] for r in out.records] == ["first", "second", "second"]


def test_tuning_pass_interleaves_systems_and_chooses_the_lowest_that_ran():
    calls = []

    def measure(system, cand):
        calls.append((system, cand))
        return {"a1": 3.0, "a2": 1.0, "b1": None, "b2": 2.0, "b3": 0.5, "c1": None}[cand]

    t = runner.tune({"a": ["a1", "a2"], "b": ["b1", "b2", "b3"], "c": ["c1"]}, measure)
    assert calls == [("a", "a1"), ("b", "b1"), ("c", "c1"), ("a", "a2"), ("b", "b2"), ("b", "b3")]
    assert t["chosen"] == {
        "a": "a2",
        "b": "b3",
        "c": None,
    }  # b1 failed: never chosen; c: every candidate failed
    assert t["measured"]["b: b1"] is None and t["measured"]["a: a2"] == 1.0


def test_mean_and_se_against_a_hand_computation():
    m = stats.mean_se([0.5, 0.7, 0.9])
    # mean 0.7; sample variance ((0.2)² + 0 + (0.2)²) / 2 = 0.04, std 0.2; SE 0.2 / sqrt(3) = 0.11547
    assert m.n == 3 and m.mean == pytest.approx(0.7, abs=1e-15)  # a few ulps of summing three doubles
    assert m.se == pytest.approx(0.2 / 3**0.5, rel=1e-12)
    one = stats.mean_se([0.4])
    assert one.se is None and one.text() == "0.40"
    d = stats.difference(stats.mean_se([0.5, 0.7, 0.9]), stats.mean_se([0.4, 0.4, 0.7]))
    # b: mean 0.5, variance (0.01+0.01+0.04)/2 = 0.03, SE² 0.01; a: SE² 0.04/3; SE of the gap sqrt(0.04/3 + 0.01)
    assert d.diff == pytest.approx(0.2, abs=1e-15) and d.se == pytest.approx(
        (0.04 / 3 + 0.01) ** 0.5, rel=1e-12
    )
    p = stats.paired({0: 1.0, 1: 2.0, 2: 4.0}, {0: 0.5, 1: 1.0, 2: 2.0, 3: 9.0})  # seed 3 has no pair
    assert p.diff == pytest.approx(7 / 6, rel=1e-12)  # differences 0.5, 1, 2
    # the same gap from the rows a results file keeps (MeanSE.row): n, mean, std and se, nothing recomputed
    a, b = stats.mean_se([0.5, 0.7, 0.9]).row(), stats.mean_se([0.4, 0.4, 0.7]).row()
    assert a == {"n": 3, "mean": m.mean, "std": m.std, "se": m.se}
    assert stats.gap_of(a, b) == d


@pytest.mark.parametrize(
    ("diff", "se", "word"),
    [(0.05, 0.02, "ahead"), (-0.05, 0.02, "behind"), (0.04, 0.02, "ahead"),  # 2.0 SE exactly: separated
     (0.039, 0.02, "not separated"), (-0.01, 0.02, "not separated"), (0.3, None, "not separated")],
)  # fmt: skip
def test_two_se_rule_words(diff, se, word):
    assert stats.Gap(diff, se).side() == word


def test_a_higher_mean_within_two_se_is_never_called_ahead():
    g = stats.difference(stats.MeanSE(0.64, 0.01, 5), stats.MeanSE(0.62, 0.01, 5))  # 0.02 / 0.014 = 1.4 SE
    assert g.side("ahead", "behind", "level") == "level"
    assert g.text() == "+0.02 ± 0.01, 1.4 SE"


def test_speedup_is_the_median_of_per_seed_ratios_not_a_ratio_of_medians():
    # times like async_vs_sync's: sync 63.5, 65.7, 55.0 s against async 40.8, 51.4, 36.0 s (per-seed ratios
    # 1.556, 1.278, 1.528): median of ratios 1.528; ratio of the medians 63.5 / 40.8 = 1.556 (not what it states)
    sync = {0: 63.5, 1: 65.7, 2: 55.0}
    fast = {0: 40.8, 1: 51.4, 2: 36.0}
    med, per = stats.median_speedup(sync, fast)
    assert per == pytest.approx([63.5 / 40.8, 65.7 / 51.4, 55.0 / 36.0], rel=1e-12)
    assert med == pytest.approx(55.0 / 36.0, rel=1e-12)
    assert stats.median_speedup({0: 10.0, 1: None}, {0: None, 1: 5.0})[1] == [0.0, None]  # never reached: 0


def test_time_to_target_and_accuracy_at_budget():
    curve = [(0.0, 0.2), (5.0, 0.4), (9.0, 0.55), (12.0, 0.5)]
    assert stats.time_to(curve, 0.55) == 9.0 and stats.time_to(curve, 0.6) is None
    assert stats.accuracy_at(curve, 10.0) == 0.55 and stats.accuracy_at(curve, -1) == 0.2
    assert stats.median_or_none([1.0, None, None]) is None and stats.median_or_none([1.0, 3.0, None]) == 2.0


def test_provenance_records_commit_cpu_load_and_versions():
    meta = provenance.Provenance(["bench.py", str(ROOT / "x")]).meta()
    assert meta["command"] == "bench.py ./x"  # portable: no path of this machine
    assert meta["cpu"]["cores"] == os.cpu_count() and meta["cpu"]["model"]
    assert len(meta["load_before"]) == 3 and len(meta["load_after"]) == 3
    assert meta["versions"]["python"] and meta["commit"]


def test_provenance_records_the_versions_of_a_second_venv_as_that_interpreter_sees_them(
    tmp_path: Path,
) -> None:
    """A side that runs in its own venv (TRL's) has its versions under meta.venvs, read by running that interpreter:
    here this one (the same versions as `versions()`) and one that cannot run ({}: the benchmark fails on its own)."""
    meta = provenance.Provenance(
        ["bench.py"], venvs={"trl": Path(sys.executable), "gone": tmp_path / "nope"}
    ).meta()
    assert meta["venvs"] == {"trl": provenance.versions(), "gone": {}}
    assert "venvs" not in provenance.Provenance(["bench.py"]).meta()


def test_cores_busy_is_each_cores_busy_share_between_two_readings() -> None:
    # core 0: 50 of 100 ticks busy; core 1: idle throughout; a core with no ticks between the readings: 0, not NaN
    assert cores.busy([(10, 100), (50, 100), (7, 7)], [(60, 200), (50, 200), (7, 7)]) == [0.5, 0.0, 0.0]
    now = cores.cpu_times()  # this machine: one (busy, total) per core, busy never above total
    assert len(now) == os.cpu_count() and all(0 <= b <= t for b, t in now)
    # a run that spins: its result back, and the machine busier than nothing while it ran
    out, during = cores.busy_during(lambda: sum(i * i for i in range(3_000_000)))
    assert out > 0 and len(during) == os.cpu_count() and sum(during) > 0


def test_provenance_keeps_the_commit_the_benchmark_started_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark of hours records the code that ran, not the tree at its end (found on 2026-12-07: slow_tools
    wrote a later commit, +dirty, after commits made while it ran)."""
    monkeypatch.setattr(provenance, "commit", lambda: "aaaaaaa")
    prov = provenance.Provenance(["bench.py"])
    monkeypatch.setattr(provenance, "commit", lambda: "bbbbbbb+dirty")
    assert prov.meta()["commit"] == "aaaaaaa"


def test_smoke_runs_write_under_runs_unless_out_is_given(tmp_path):
    assert report.results_dir(None, scratch=False, name="x") == report.RESULTS
    assert report.results_dir(None, scratch=True, name="x") == ROOT / "runs" / "bench" / "x"
    assert report.results_dir(tmp_path, scratch=True, name="x") == tmp_path
    assert report.table(["a", "b"], [[1, None]]) == ["| a | b |", "|---|---|", "| 1 | - |"]


def test_portable_rewrites_whole_path_prefixes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout at <W>/main, where <W> is the development machines' work folder (built below so that this file
    names no machine path): its paths shortened, and a results key 'tir/workers=1' left whole (its '<W>' is not a
    path: a path character follows it)."""
    w = "/" + "work"
    monkeypatch.setattr(provenance, "ROOT", Path(f"{w}/main"))
    text = f"{w}/main/benchmarks/x.py {w}/other cd {w}/main; current/tir/workers=1 {w}/main-old"
    assert provenance.portable(text) == "./benchmarks/x.py ../other cd .; current/tir/workers=1 ../main-old"


def test_a_checkout_in_the_temporary_folder_keeps_other_temporary_paths_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh clone in /tmp: its own paths are shortened, a scratch folder beside it in /tmp is not (a committed
    results file naming one, rewritten there by --from-results, reads as it was written)."""
    tmp = Path(tempfile.gettempdir())
    monkeypatch.setattr(provenance, "ROOT", tmp / "ci")
    text = f"{tmp}/ci/benchmarks/x.py --out {tmp}/eb_idle/out"
    assert provenance.portable(text) == f"./benchmarks/x.py --out {tmp}/eb_idle/out"


def test_complete_seeds_are_those_with_every_cell_run() -> None:
    out = runner.Outcome(records=[], missing=[runner.Job("B", 1), runner.Job("A", 2)])
    assert out.complete_seeds(["A", "B"], [0, 1, 2]) == [0]
    assert out.complete_seeds(["A"], range(3)) == [0, 1]


def test_a_failed_train_run_stops_the_benchmark_with_one_line_naming_its_log(tmp_path: Path) -> None:
    """harness.train empties the run dir first, puts the run's output in RUN_DIR.log beside it, and a run that
    fails stops the benchmark with one line naming the run and that log (here: a recipe that does not exist)."""
    from benchmarks.harness import train

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "left_from_before").write_text("x")
    with pytest.raises(SystemExit, match=r"^cell a seed 0 failed \(exit [1-9]\d*\); log .*/runs/r\.log$"):
        train.train(tmp_path / "no_such_recipe.yaml", ["train.steps=1"], run_dir, name="cell a seed 0")
    assert not (run_dir / "left_from_before").exists()
    assert "no_such_recipe.yaml" in (tmp_path / "runs" / "r.log").read_text()


def test_from_results_names_a_missing_or_broken_file_in_one_line(tmp_path, capsys) -> None:
    """Every benchmark's --from-results (harness.report.results_file): argparse's one-line error, no traceback."""
    import argparse

    from benchmarks.harness.report import results_args

    p = argparse.ArgumentParser(prog="bench")
    results_args(p, "bench")
    good = tmp_path / "r.json"
    good.write_text('{"runs": []}')
    assert p.parse_args(["--from-results", str(good)]).from_results == good
    (tmp_path / "bad.json").write_text("{bad")
    for name, says in (("missing.json", "cannot read it"), ("bad.json", "JSON error at line 1")):
        with pytest.raises(SystemExit) as e:
            p.parse_args(["--from-results", str(tmp_path / name)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("bench: error: argument --from-results:") and name in err and says in err
