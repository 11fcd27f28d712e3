"""A results page the docs include is what its benchmark's report step renders from the results JSON.

The docs include benchmarks/results/NAME.md whole; these tests render each one again from NAME.json with the
benchmark's own report function and compare, so a figure on a page cannot differ from its file. Not covered:
the benchmarks that render inside main() (learner_step, long_context, packing, env_bench, mismatch,
lora_engines, topology, trajectory_log_bench, vcpo_overhead, constrained_is, the stress reports other than
level_b_fair).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(
    0, str(ROOT / "benchmarks")
)  # the benchmarks import their neighbours (train_cmd, vs_trl_report) as scripts do


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _via_path(module: str, function: str, name: str) -> Callable[[Path], str]:
    def render(tmp: Path) -> str:
        out = tmp / "out.md"
        getattr(__import__(module), function)(_load(name), out)
        return out.read_text()

    return render


def _level_b_fair(tmp: Path) -> str:
    from benchmarks.stress import level_b_fair_report

    report = _load("stress/level_b_fair.json")
    return level_b_fair_report.markdown(report, report["missing"])


RENDERERS: dict[str, Callable[[Path], str]] = {
    "vs_trl.md": lambda tmp: __import__("vs_trl_report").markdown(_load("vs_trl.json")),
    "async_vs_sync.md": lambda tmp: __import__("async_vs_sync").markdown(_load("async_vs_sync.json")),
    "torch_learner_speed.md": lambda tmp: __import__("torch_learner_speed").markdown(
        _load("torch_learner_speed.json")
    ),
    "vs_trl_quick.md": lambda tmp: __import__("vs_trl_report").markdown(_load("vs_trl_quick.json")),
    "orchestration.md": lambda tmp: __import__("orchestration")._markdown(_load("orchestration.json")),
    "sandbox_bench.md": lambda tmp: __import__("sandbox_bench").markdown(_load("sandbox_bench.json")),
    "engine_bench.md": _via_path("engine_bench", "write_markdown", "engine_bench.json"),
    "reliability.md": lambda tmp: __import__("scripts.reliability", fromlist=["markdown"]).markdown(
        _load("reliability.json")
    ),
    "distill.md": lambda tmp: __import__("distill").markdown(_load("distill.json")),
    "moe_replay.md": lambda tmp: __import__("moe_replay").markdown(_load("moe_replay.json")),
    "stress/level_b_fair.md": _level_b_fair,
}


@pytest.mark.parametrize("name", list(RENDERERS))
def test_an_included_results_page_is_its_report_step_rendering_of_the_json(name: str, tmp_path: Path) -> None:
    assert RENDERERS[name](tmp_path) == (RESULTS / name).read_text(), (
        f"benchmarks/results/{name} differs from what its report step renders from the JSON: rerun the report"
    )


def test_a_figure_changed_in_the_json_changes_the_page(tmp_path: Path) -> None:
    import vs_trl_report

    data = _load("vs_trl.json")
    data["summary"]["time_to_trl_final_speedup"] += 1.0
    assert vs_trl_report.markdown(data) != (RESULTS / "vs_trl.md").read_text()
