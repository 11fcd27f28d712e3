"""benchmarks/slow_tools.py: episodes in flight from the rollout's counters, the paired time-to-target
summary and its page (the --quick run end to end with Docker: tests/sandboxes/test_slow_tools_quick.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks.slow_tools import Cell, in_flight, markdown, summarise  # noqa: E402


def test_episodes_in_flight_are_the_episodes_seconds_over_the_wall_time():
    # step 1: 4 episodes of 5 s each in 10 s; step 2: 6 more of 10 s in 10 s -> (20 + 60) / 20 = 4 in flight
    recs = [
        {"rollout/episodes": 4, "rollout/episode_seconds": 5.0, "perf/step_seconds": 10.0},
        {"rollout/episodes": 10, "rollout/episode_seconds": 10.0, "perf/step_seconds": 10.0},
    ]
    assert in_flight(recs) == {"mean": 4.0, "episodes": 10}


def _run(cell: str, k: int, seed: int, curve: list, final: float) -> dict:
    return {
        "cell": cell, "k": k, "seed": seed, "curve": curve, "final_accuracy": final, "end_accuracy": curve[-1][1],
        "seconds_per_step_median": 1.0, "tools": {"tool_share_median": 0.8, "episode_seconds_median": 3.0},
        "in_flight": {"mean": 10.0, "episodes": 64},
    }  # fmt: skip


def test_the_target_is_paired_by_seed_and_the_speedup_is_the_median_of_per_seed_ratios():
    runs = [
        _run("sync k=0", 0, 0, [(0, 0.1), (10, 0.3), (20, 0.5)], 0.5),
        _run("sync k=0", 0, 1, [(0, 0.1), (30, 0.4)], 0.4),
        _run("async k=2", 2, 0, [(0, 0.1), (5, 0.5)], 0.5),  # 20 / 5 = 4x
        _run("async k=2", 2, 1, [(0, 0.1), (15, 0.35), (20, 0.45)], 0.45),  # seed 1's target is 0.4: 30 / 20
    ]
    s = summarise(runs, [Cell("sync k=0", 0), Cell("async k=2", 2)])
    assert s["target_per_seed"] == {0: 0.5, 1: 0.4}
    assert s["speedup_vs_sync"]["async k=2"]["per_seed"] == [4.0, 1.5]
    assert s["speedup_vs_sync"]["async k=2"]["speedup_median"] == 2.75
    assert s["goal_reached"] is True
    never = [*runs[:2], _run("async k=2", 2, 0, [(0, 0.1)], 0.1), _run("async k=2", 2, 1, [(0, 0.1)], 0.1)]
    s = summarise(never, [Cell("sync k=0", 0), Cell("async k=2", 2)])
    assert s["speedup_vs_sync"]["async k=2"]["per_seed"] == [0.0, 0.0] and s["goal_reached"] is False


def test_the_page_says_the_goal_and_the_load():
    runs = [
        _run("sync k=0", 0, 0, [(0, 0.1), (10, 0.3)], 0.3),
        _run("async k=2", 2, 0, [(0, 0.1), (4, 0.3)], 0.3),
    ]
    data = {
        "meta": {"command": "slow_tools.py", "date": "d", "commit": "c", "cpu": {"model": "m", "cores": 2},
                 "load_before": [3.0, 0, 0], "load_after": [4.0, 0, 0], "elapsed_s": 60},
        "design": {"tasks": 300, "batch_prompts": 8, "sync_steps": 16, "async_steps_factor": 1.5,
                   "checkpoint_every": 2, "eval_tasks": 100, "warm_start_accuracy": 0.1, "seeds": 1, "trl": "not run",
                   "max_in_flight": 32},
        "summary": summarise(runs, [Cell("sync k=0", 0), Cell("async k=2", 2)]),
    }  # fmt: skip
    text = markdown(data)
    assert "REACHED" in text and "load average 3.00 at the start" in text and "| 2.50 (2.50) |" in text


def test_the_committed_page_is_what_its_results_file_renders():
    import json

    results = ROOT / "benchmarks" / "results"
    data = json.loads((results / "slow_tools_quick.json").read_text())
    assert markdown(data) == (results / "slow_tools_quick.md").read_text()
