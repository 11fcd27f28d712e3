"""benchmarks/distill.py: the goal arithmetic on hand-made cells, and the --quick machinery run (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from distill import _third, goals, score_until  # noqa: E402


def _cell(method, k, seed, steps_to_target=None, final=0.7, s_per_step=1.0, topology="inprocess", wait=0.0):
    return {
        "name": f"{method} k={k} s{seed} {topology}", "method": method, "k": k, "seed": seed, "student": "main",
        "topology": topology, "evaluate": topology == "inprocess", "steps_to_target": steps_to_target,
        "final3_accuracy": final, "seconds_per_step_median": s_per_step, "teacher_wait_share": wait,
    }  # fmt: skip


def test_a_third_of_rls_steps_counts_misses_as_the_issue_reads_them():
    assert _third(4, 12) is True and _third(5, 12) is False
    assert _third(None, 12) is False  # distillation never got there, RL did
    assert _third(6, None) is True  # RL did not get there within the budget, distillation did
    assert _third(None, None) is None and _third(0, 0) is None


def test_checkpoints_are_scored_up_to_the_first_at_the_target_and_at_the_last_three():
    acc = {1: 0.3, 2: 0.5, 3: 0.7, 4: 0.72, 5: 0.71, 6: 0.74, 8: 0.75, 10: 0.76}
    asked: list[int] = []

    def score(steps):
        asked.extend(steps)
        return [acc[s] for s in steps]

    got = score_until(list(acc), 0.68, score)
    assert asked == [1, 2, 3, 6, 8, 10] and got == {s: acc[s] for s in asked}


def test_goals_pair_cells_by_seed():
    cells = [
        _cell("distill", 0, 0, 3, final=0.72), _cell("rl", 0, 0, 12), _cell("distill", 4, 0, 4, final=0.70),
        _cell("distill", 0, 1, 5, final=0.74), _cell("rl", 0, 1, 12), _cell("distill", 4, 1, 5, final=0.71),
        _cell("rl", 0, 0, s_per_step=2.0, topology="processes"),
        _cell("rl+teacher@0", 0, 0, s_per_step=2.1, topology="processes", wait=0.03),
    ]  # fmt: skip
    g = goals(cells)
    assert g["distill_over_rl_steps_per_seed"] == [0.25, 5 / 12]
    assert g["distill_steps_at_most_a_third_of_rl"] is False  # seed 1 needs 5 > 12 / 3 steps
    # mean ± standard error over seeds: sample sd / sqrt(n); for two seeds |a − b| / 2
    assert g["distill_over_rl_steps_mean"] == pytest.approx(1 / 3)
    assert g["distill_over_rl_steps_se"] == pytest.approx((5 / 12 - 0.25) / 2)
    assert g["distill_k4_minus_k0_final_se"] == pytest.approx(0.005)
    assert g["distill_k4_minus_k0_final_per_seed"] == pytest.approx([-0.02, -0.03])
    assert g["distill_k4_within_2_points_of_k0"] is False  # mean gap 2.5 points
    assert g["teacher_step_time_overhead_median"] == pytest.approx(0.05)
    assert g["teacher_overhead_at_most_10pct"] is True


def test_the_cells_beside_the_goals_pair_by_seed_too():
    small = dict(
        _cell("distill", 0, 0, final=0.1), student="small", lr=1e-3, curve=[[0, 0.0, 0.2], [6, 9.0, 0.4]]
    )
    cells = [
        dict(_cell("both", 0, 0, 2, final=0.70), lr=1e-3), dict(_cell("both", 4, 0, 4, final=0.66), lr=1e-3),
        dict(_cell("both", 0, 1, 12, final=0.72), lr=1e-3), dict(_cell("both", 4, 1, 3, final=0.70), lr=1e-3),
        _cell("rl", 0, 0, 8, final=0.75), _cell("rl", 4, 0, 8, final=0.76), _cell("rl", 0, 1, 8, final=0.74), small,
    ]  # fmt: skip
    a = goals(cells, distill_lr=1e-3)["also"]
    assert a["both_over_rl_steps_per_seed"] == [0.25, 1.5]
    assert a["both_over_rl_steps_se"] == pytest.approx((1.5 - 0.25) / 2)
    assert a["both_k4_minus_k0_final_per_seed"] == pytest.approx([-0.04, -0.02])
    assert a["rl_k4_minus_k0_final_per_seed"] == pytest.approx([0.01])  # seed 1 has no RL k=4 run: not paired
    assert a["small_distill_final_per_seed"] == [0.1] and a["small_distill_peak_per_seed"] == [0.4]
    assert "small_rl_final_per_seed" not in a


@pytest.mark.slow  # two `agent-rl train` processes: ~1.5 min on the loaded 2-core machine, not the 60 s of a smoke test
@pytest.mark.heavy  # a benchmark end to end: make test-heavy (make test's 30-minute budget)
def test_quick_run_writes_its_results_and_names_the_cells_it_ran(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "distill.py"), "--quick", "--work", str(tmp_path / "w"),
           "--out", str(out)]  # fmt: skip
    # a time limit already passed starts no cell, and the results file says both are missing
    stopped = subprocess.run([*cmd, "--time-limit-min", "0"], cwd=ROOT, check=True, capture_output=True, text=True,
                             timeout=1200)  # fmt: skip
    res = json.loads((out / "distill_quick.json").read_text())
    assert res["cells_done"] == [] and res["cells_missing"] == ["distill k=0 s0", "rl k=0 s0"], res
    assert "time limit reached: 2 cells left" in stopped.stdout + stopped.stderr
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=1200)
    res = json.loads((out / "distill_quick.json").read_text())
    assert res["cells_done"] == ["distill k=0 s0", "rl k=0 s0"] and res["cells_missing"] == []
    distill = next(c for c in res["cells"] if c["method"] == "distill")
    assert distill["reverse_kl"] and distill["steps_run"] == 3
    assert "| distill k=0 |" in (out / "distill_quick.md").read_text()
