"""benchmarks/results/vs_trl.json is a fair measurement by its own record: the tuning pass ran in the invocation
that measured, every cell runs the configuration that pass chose, the summary (headline included) is what its
per-run records give, and the docs' headline sentence states the file's figures. `check_tuning` and
`check_summary` are applied to the SmolLM2 quick run's file too (test_vs_trl_smollm2_quick.py)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vs_trl  # noqa: E402
from vs_trl_report import GOAL_SPEEDUP, cell_name, summarise  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "vs_trl.json"


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(RESULTS.read_text())


_DATA = json.loads(RESULTS.read_text())
UNTUNED = not (_DATA["tuning"].get("steps", 0) > 0 and _DATA["tuning"].get("same_invocation"))


def _tuning_group(cell: str) -> str:
    return "trl" if cell.startswith("trl ") else cell


def check_tuning(data: dict, cands: dict) -> None:
    """The tuning pass ran in the invocation, chose each group's fastest candidate that ran, every cell runs
    that choice, and `cands` (what vs_trl.candidates gives for the file's job) were all measured."""
    t = data["tuning"]
    assert t["steps"] >= 2 and t.get("same_invocation") is True, "no tuning pass in its invocation"
    for group, chosen in t["chosen"].items():
        mine = {
            k: v for k, v in t["median_s_per_step"].items() if k.startswith(f"{group}: ") and v is not None
        }
        assert f"{group}: {chosen['label']}" == min(mine, key=mine.get), f"{group}: not the fastest candidate"
    # every measured cell runs what the pass chose for it
    for r in data["cells"]:
        assert r["config"] == t["chosen"][_tuning_group(cell_name(r))]["label"], cell_name(r)
    # and every candidate (TRL threads x micro-batches, agent-rl topologies, threads, learner micro-batch) was
    # measured
    want = {f"{name}: {c.label}" for name, cs in cands.items() for c in cs}
    measured = set(t["median_s_per_step"])
    assert measured == want


def test_vs_trl_results_carry_the_tuning_pass_of_the_same_invocation(data: dict) -> None:
    check_tuning(data, vs_trl.candidates())


def test_vs_trl_has_the_three_trl_cells(data: dict) -> None:
    names = {cell_name(r) for r in data["cells"]}
    assert {"trl shipped", "trl shipped-constant-lr", "trl closest"} <= names


def test_the_docs_say_what_the_measurement_lacks(data: dict) -> None:
    from scripts.docs.figures import vs_trl_caveats, vs_trl_headline

    if (data["steps"], data["seeds"]) != (30, 3):
        assert "not the full set" in vs_trl_caveats()
    if UNTUNED:
        assert vs_trl_headline().startswith("**not yet the fair measurement**")
        assert "ran no tuning pass" in vs_trl_caveats()
    if "trl shipped-constant-lr" not in {cell_name(r) for r in data["cells"]}:
        assert "no TRL cell with TRL's default loss and a constant lr" in vs_trl_caveats()


def check_summary(data: dict, goal_speedup: float = GOAL_SPEEDUP) -> None:
    """The summary (headline included) is what the file's per-run records give."""
    cells = copy.deepcopy(data["cells"])
    assert summarise(cells, data["k_async_fixed_before_runs"], data["budget_s"], goal_speedup) == json.loads(
        json.dumps(data["summary"])
    )
    h = data["summary"]["headline"]
    ranked = [c for c in h["trl_cells_by_time_to_target"] if c["time_to_target_s"] is not None]
    if ranked:  # against the TRL cell that got to the target soonest, not a slower one
        assert h["against"] == min(ranked, key=lambda c: c["time_to_target_s"])["cell"]


def test_vs_trl_summary_and_headline_are_what_its_runs_give(data: dict) -> None:
    check_summary(data)


def test_the_docs_headline_states_the_files_figures(data: dict) -> None:
    from scripts.docs.figures import vs_trl_headline

    h = data["summary"]["headline"]
    k = data["k_async_fixed_before_runs"]
    d = h[f"agent-rl k={k}"]
    text = vs_trl_headline()
    x = d["speedup_train"]
    assert (f"**{x:.2f}× sooner**" if x >= 1 else f"**{1 / x:.2f}× later** ({x:.2f}× sooner)") in text
    assert f"{d['speedup_process']:.2f}× in whole-process time" in text
    assert f"{d['speedup_cpu']:.2f}× in CPU time" in text
    assert f"TRL's fastest cell to it ({h['against'].removeprefix('trl ')}" in text
    assert f"cores busy {h['cores_busy'][f'agent-rl k={k}']:.2f}" in text
    assert f"cores busy {h['cores_busy'][h['against']]:.2f}" in text
    assert f"{data['seeds']} seeds × {data['steps']} steps" in text
