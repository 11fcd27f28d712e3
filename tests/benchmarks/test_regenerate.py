"""Every results file of a benchmark on the harness is what the harness's code computes from the raw runs the
file keeps: regenerated here from those runs alone (no re-run), it equals the committed file, numbers and words.
So a figure cannot be edited by hand, and a change to benchmarks/harness/stats.py that moves a committed
number fails here until the file is regenerated and the change explained."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import their neighbours as scripts do


def _no_runs(tmp_path: Path) -> Path:
    return tmp_path / "no-runs"  # an empty runs folder: only the cells the committed JSON keeps


def test_async_vs_sync_summary_is_what_its_runs_give(tmp_path: Path) -> None:
    import async_vs_sync

    committed = json.loads((RESULTS / "async_vs_sync.json").read_text())
    async_vs_sync.main(["--from-results", str(RESULTS / "async_vs_sync.json"), "--out", str(tmp_path)])
    again = json.loads((tmp_path / "async_vs_sync.json").read_text())
    assert again == committed
    assert (tmp_path / "async_vs_sync.md").read_text() == (RESULTS / "async_vs_sync.md").read_text()


def test_vs_trl_summary_is_what_its_runs_give() -> None:
    from vs_trl_report import summarise

    d = json.loads((RESULTS / "vs_trl.json").read_text())
    assert summarise(d["cells"], d["k_async_fixed_before_runs"], d["budget_s"]) == d["summary"]


@pytest.mark.parametrize("name", ["k_sweep2", "k_sweep"])
def test_the_k_sweep_report_is_what_its_kept_runs_give(tmp_path: Path, name: str) -> None:
    """`python -m benchmarks.stress.k_sweep report --from-results FILE --out OUT`: the JSON, page and figure again."""
    from benchmarks.stress import k_sweep

    src = RESULTS / "stress" / f"{name}.json"
    out = tmp_path / f"{name}.json"
    k_sweep.main(
        ["report", "--from-results", str(src), "--out", str(out), "--warm", str(ROOT / k_sweep.WARM)]
    )
    assert json.loads(out.read_text()) == json.loads(src.read_text())
    assert out.with_suffix(".md").read_text() == src.with_suffix(".md").read_text()
    assert out.with_suffix(".png").is_file()


def test_the_level_b_fair_report_is_what_its_kept_runs_give(tmp_path: Path) -> None:
    from benchmarks.stress import level_b_fair
    from benchmarks.stress.level_b_fair_report import write

    src = RESULTS / "stress" / "level_b_fair.json"
    out = tmp_path / "level_b_fair.json"
    write(level_b_fair.read_cells(_no_runs(tmp_path), src), out)
    assert json.loads(out.read_text()) == json.loads(src.read_text())
    assert out.with_suffix(".md").read_text() == src.with_suffix(".md").read_text()


def test_distill_report_is_what_its_cells_give() -> None:
    """benchmarks/results/distill.json from the runs in distill_cells.jsonl, the plan of its own command and its
    own head (teacher, student, target ...)."""
    import distill

    d = json.loads((RESULTS / "distill.json").read_text())
    rows = [json.loads(x) for x in (RESULTS / "distill_cells.jsonl").read_text().splitlines()]
    cells = [r for r in rows if not r["name"].startswith("eval")]
    assert d["command"] == "benchmarks/distill.py --distill-lr 1e-3"  # the defaults below are that command's
    planned = distill.cells_for(3, d["steps"], d["rl_steps"], 12, d["distill_lr"], 1e-3)
    head = {k: v for k, v in d.items() if k not in ("cells_done", "cells_missing", "table", "goals", "cells")}
    assert json.loads(json.dumps(distill.report(cells, planned, head))) == d  # tuples as the JSON writes them


def test_the_responses_report_is_what_its_kept_cells_give(tmp_path: Path) -> None:
    """responses.{json,md} of the collapse monitor's responses from the cells responses.json keeps (no run dir), by
    `python -m benchmarks.stress.responses_report NONE OUT.md`."""
    import shutil

    from benchmarks.stress import responses_report

    src = RESULTS / "stress"
    shutil.copy(src / "responses.json", tmp_path / "responses.json")
    responses_report.main(str(_no_runs(tmp_path)), str(tmp_path / "responses.md"))
    assert json.loads((tmp_path / "responses.json").read_text()) == json.loads(
        (src / "responses.json").read_text()
    )
    assert (tmp_path / "responses.md").read_text() == (src / "responses.md").read_text()


def test_the_level_a_grid_summary_is_what_its_packed_runs_give(tmp_path: Path) -> None:
    """summary.{json,md} of the staleness grid (level a) from runs.jsonl.gz (every run, packed) and the step-time
    file beside it, by `python -m benchmarks.stress.grid --report-only`."""
    import shutil

    from benchmarks.stress import grid

    src = RESULTS / "stress"
    for name in ("runs.jsonl.gz", "steptime.json"):
        shutil.copy(src / name, tmp_path / name)
    assert grid.main(["--report-only", "--out", str(tmp_path)]) == 0
    for name in ("summary.json", "summary.md"):
        assert (tmp_path / name).read_text() == (src / name).read_text(), name


BENCHMARKS = ["topology", "trajectory_log_bench", "vcpo_overhead", "learner_step_opob", "moe_replay", "orchestration",
              "env_bench", "constrained_is", "mismatch", "engine_bench", "engine_bench_smollm2_issue62_before",
              "engine_bench_smollm2_issue62_after", "engine_bench_smollm2_issue62_after_avx2",
              "engine_bench_smollm2_issue62_idle", "engine_bench_smollm2_issue62_idle_avx2", "vs_trl", "vs_trl_quick",
              "vs_trl_profile", "vs_trl_profile_quick", "learner_step_agent_arith", "learner_step_agent_arith_2threads",
              "slow_tools_quick", "slow_tools", "slow_tools_bound", "engine_fork", "vs_trl_rerun", "vs_trl_mb64", "vs_trl_lasthalf"]  # fmt: skip
MODULE = {"learner_step_opob": "learner_step"} | {  # a results file named otherwise than its benchmark
    f"engine_bench_smollm2_issue62_{x}": "engine_bench" for x in ("before", "after", "after_avx2", "idle", "idle_avx2")} | {
    "vs_trl_quick": "vs_trl", "vs_trl_rerun": "vs_trl", "vs_trl_mb64": "vs_trl", "vs_trl_lasthalf": "vs_trl", "vs_trl_profile_quick": "vs_trl_profile", "slow_tools_quick": "slow_tools",
    "slow_tools_bound": "slow_tools",
    "learner_step_agent_arith_2threads": "learner_step_agent_arith"}  # fmt: skip


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_results_file_is_what_its_runs_give(tmp_path: Path, name: str) -> None:
    """`--from-results FILE` rewrites NAME.{json,md} from the committed file's own runs: the same numbers and words
    (the summaries of topology, trajectory_log_bench, vcpo_overhead, learner_step_opob, vs_trl, vs_trl_profile,
    slow_tools, engine_fork and learner_step_agent_arith's ratios are recomputed from their runs; moe_replay's, orchestration's,
    env_bench's and mismatch's are kept, constrained_is's page is computed from its per-seed rows; each page is
    rendered from the JSON)."""
    module = __import__(MODULE.get(name, name))
    module.main(["--from-results", str(RESULTS / f"{name}.json"), "--out", str(tmp_path)])
    assert json.loads((tmp_path / f"{name}.json").read_text()) == json.loads(
        (RESULTS / f"{name}.json").read_text()
    )
    assert (tmp_path / f"{name}.md").read_text() == (RESULTS / f"{name}.md").read_text()


@pytest.mark.parametrize(
    "module, name", [("monitor_eval", "monitor"), ("multistep_failures", "multistep_failures")]
)
def test_a_stress_page_is_what_its_json_gives(module: str, name: str) -> None:
    """The collapse monitor's and the multistep failures' pages rendered from their committed JSON alone (their raw
    runs are not all committed: the monitor's are, `python -m benchmarks.stress.monitor_eval` regenerates both)."""
    mod = __import__(f"benchmarks.stress.{module}", fromlist=["markdown"])
    data = json.loads((RESULTS / "stress" / f"{name}.json").read_text())
    assert mod.markdown(data) + "\n" == (RESULTS / "stress" / f"{name}.md").read_text()
