"""The time-to-accuracy arithmetic of benchmarks/vs_trl.py (and async_vs_sync.py) on hand-made cells."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from vs_trl_report import markdown, summarise  # noqa: E402

from benchmarks.harness.stats import accuracy_at, median_or_none, speedup_per_seed, spread, time_to  # noqa: E402


def test_time_to_and_accuracy_at_read_the_curve_in_time_order() -> None:
    curve = [(0.0, 0.1), (10.0, 0.3), (20.0, 0.25), (30.0, 0.5)]
    assert time_to(curve, 0.3) == 10.0
    assert time_to(curve, 0.4) == 30.0
    assert time_to(curve, 0.6) is None
    assert accuracy_at(curve, 25.0) == 0.25  # the last point within the budget, not the best one
    assert accuracy_at(curve, 5.0) == 0.1


def test_median_needs_most_seeds_and_speedup_counts_a_miss_as_zero() -> None:
    assert median_or_none([1.0, None, 3.0]) == 2.0
    assert median_or_none([1.0, None, None]) is None
    assert speedup_per_seed({0: 10.0, 1: 12.0, 2: None}, {0: 5.0, 1: None, 2: 4.0}) == {
        0: 2.0,
        1: 0.0,
        2: None,
    }
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}


def _cell(system, loss, k, seed, s_per_step, curve, process_offset=5.0, cores_busy=1.5) -> dict:
    return {
        "system": system, "loss": loss, "k": k, "seed": seed, "config": "x", "s_per_step": s_per_step,
        "train_seconds": curve[-1][0], "process_wall_s": curve[-1][0] + 10, "cores_busy": cores_busy,
        "curve": curve, "curve_process": [(t + process_offset if t else 0.0, a) for t, a in curve],
        "final_accuracy": curve[-1][1],
    }  # fmt: skip


def test_summary_pairs_seeds_and_takes_medians() -> None:
    cells = []
    for seed, (k0_step, trl_step) in enumerate([(3.0, 2.0), (2.0, 2.0), (1.0, 2.0)]):
        cells += [
            _cell("agent-rl", "vcpo", 0, seed, k0_step, [(0.0, 0.1), (30.0, 0.3), (60.0, 0.5)]),
            _cell("agent-rl", "vcpo", 2, seed, 1.0, [(0.0, 0.1), (10.0, 0.3), (20.0, 0.4), (30.0, 0.5)]),
            _cell("trl", "shipped", 0, seed, trl_step, [(0.0, 0.1), (40.0, 0.2), (80.0, 0.4)]),
        ]
    s = summarise(cells, 2, budget_s=25.0)
    assert s["agent_rl_k0_over_trl_s_per_step_per_seed"] == [1.5, 1.0, 0.5]
    assert s["agent_rl_k0_over_trl_s_per_step"] == 1.0
    assert s["agent_rl_k0_over_fastest_trl_s_per_step"] == 1.0  # medians 2.0 and 2.0
    assert s["goals"]["agent_rl_k0_step_at_or_under_the_fastest_trl_step"] is True
    # TRL reaches its final 0.4 at 80 s; agent-rl k=2 at 20 s: 4x on training time, (85/25) on process time
    assert s["time_to_trl_final_speedup"] == pytest.approx(4.0)
    assert s["time_to_trl_final_speedup_process"] == pytest.approx(85 / 25)
    # target: 90% of k=0's final 0.5 = 0.45; k=2 gets there at 30 s, TRL never
    k2 = s["per_cell"]["agent-rl k=2"]
    assert k2["time_to_target_s"] == 30.0 and k2["reached_target"] == 3
    assert s["per_cell"]["trl shipped"]["time_to_target_s"] is None
    assert k2["accuracy_at_budget_mean"] == pytest.approx(0.4)
    assert all("time_to_target_s" in c for c in cells)
    assert "agent-rl k=2" in markdown(
        {"summary": s, "cells": cells, "command": "c", "date": "d", "machine": "m", "recipe": "r", "steps": 3,
         "seeds": 3, "checkpoint_every": 1, "eval_tasks": 10, "warm_start_accuracy": 0.1,
         "k_async_fixed_before_runs": 2, "tuning": {"steps": 0, "median_s_per_step": {}}}
    )  # fmt: skip


def test_an_async_run_that_never_reaches_trl_final_counts_as_no_speedup() -> None:
    cells = [
        _cell("agent-rl", "vcpo", 0, 0, 2.0, [(0.0, 0.1), (30.0, 0.3)]),
        _cell("agent-rl", "vcpo", 2, 0, 1.0, [(0.0, 0.1), (30.0, 0.2)]),
        _cell("trl", "shipped", 0, 0, 2.0, [(0.0, 0.1), (40.0, 0.4)]),
    ]
    s = summarise(cells, 2, budget_s=25.0)
    assert s["time_to_trl_final_speedup"] == 0.0
    assert s["goals"]["agent_rl_k2_1.5x_sooner_than_the_fastest_trl_cell"] is False


def _three_trl_cells(seed: int, shipped: list, constant: list, closest: list) -> list[dict]:
    return [
        _cell("trl", "shipped", 0, seed, 2.0, shipped, cores_busy=1.0),
        _cell("trl", "shipped-constant-lr", 0, seed, 2.0, constant, cores_busy=1.0),
        _cell("trl", "closest", 0, seed, 2.0, closest, cores_busy=1.0),
    ]


def test_the_headline_is_against_the_trl_cell_that_reaches_the_target_soonest() -> None:
    cells = []
    for seed in range(3):
        cells += [
            _cell("agent-rl", "vcpo", 0, seed, 2.0, [(0.0, 0.1), (30.0, 0.3), (60.0, 0.5)], cores_busy=1.0),
            _cell("agent-rl", "vcpo", 2, seed, 1.0, [(0.0, 0.1), (15.0, 0.3), (30.0, 0.5)], cores_busy=2.0),
            # target 0.45 (90% of k=0's 0.5): shipped never, constant lr at 45 s, closest at 60 s
            *_three_trl_cells(
                seed,
                [(0.0, 0.1), (40.0, 0.3), (80.0, 0.4)],
                [(0.0, 0.1), (45.0, 0.46), (90.0, 0.47)],
                [(0.0, 0.1), (60.0, 0.45), (90.0, 0.6)],
            ),
        ]
    h = summarise(cells, 2, budget_s=25.0)["headline"]
    assert h["against"] == "trl shipped-constant-lr"  # not the weakest (shipped) nor the best final (closest)
    assert [c["cell"] for c in h["trl_cells_by_time_to_target"]] == [
        "trl shipped-constant-lr", "trl closest", "trl shipped"
    ]  # fmt: skip
    k2 = h["agent-rl k=2"]
    assert k2["speedup_train"] == pytest.approx(45 / 30) and k2["speedup_train_per_seed"] == [1.5] * 3
    assert k2["speedup_process"] == pytest.approx(50 / 35)  # 5 s of start-up on both curves
    # CPU time: process time to the target x cores busy, 50 x 1.0 against 35 x 2.0
    assert k2["speedup_cpu"] == pytest.approx(50 / 70)
    assert h["cores_busy"] == {"agent-rl k=0": 1.0, "agent-rl k=2": 2.0, **dict.fromkeys(
        ("trl shipped", "trl shipped-constant-lr", "trl closest"), 1.0)}  # fmt: skip
    assert h["agent-rl k=0"]["speedup_train"] == pytest.approx(45 / 60)
    text = markdown(
        {"summary": summarise(cells, 2, 25.0), "cells": cells, "command": "c", "date": "d", "machine": "m",
         "recipe": "r", "steps": 3, "seeds": 3, "checkpoint_every": 1, "eval_tasks": 10,
         "warm_start_accuracy": 0.1, "k_async_fixed_before_runs": 2,
         "tuning": {"steps": 5, "same_invocation": True, "median_s_per_step": {"trl: a": 1.0, "trl: b": 2.0},
                    "cores_busy": {"trl: a": 0.9}, "chosen": {"trl": {"label": "a"}}}}
    )  # fmt: skip
    assert "1.50x sooner than the fastest TRL cell to it, trl shipped-constant-lr" in text
    assert "- **trl: a**: 1.00 s/step, cores busy 0.90" in text and "- trl: b: 2.00 s/step" in text


def test_when_no_trl_cell_reaches_the_target_the_headline_takes_the_best_trl_to_its_own_final() -> None:
    cells = [
        _cell("agent-rl", "vcpo", 0, 0, 2.0, [(0.0, 0.1), (30.0, 0.9)]),
        _cell("agent-rl", "vcpo", 2, 0, 1.0, [(0.0, 0.1), (10.0, 0.5), (20.0, 0.9)]),
        *_three_trl_cells(0, [(0.0, 0.1), (40.0, 0.3)], [(0.0, 0.1), (40.0, 0.5)], [(0.0, 0.1), (40.0, 0.4)]),
    ]
    h = summarise(cells, 2, budget_s=25.0)["headline"]
    assert (
        h["against"] == "trl shipped-constant-lr"
        and "final accuracy of trl shipped-constant-lr" in h["target"]
    )
    assert h["agent-rl k=2"]["speedup_train"] == pytest.approx(40 / 10)
