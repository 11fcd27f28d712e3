"""The offline scoring of the collapse warning on hand-built runs."""

from __future__ import annotations

import math

from benchmarks.stress.monitor_eval import (
    Batch,
    RunSeries,
    _onset,
    final_accuracy,
    lag_baseline,
    policy_curve,
    split_seeds,
)
from vcpo.monitor import MonitorThresholds

TH = MonitorThresholds(
    window=3, min_unhealthy=2, warmup=2, ess_floor=0.1, grad_spike=math.inf, kl_ceiling=math.inf
)


def _run(
    name: str, ess: list[float], *, collapsed: bool, onset: int | None, seed: int = 0, lag: int = 4
) -> RunSeries:
    n = len(ess)
    return RunSeries(
        level="b", name=name, lag=lag, seed=seed, steps=list(range(n)), collapsed=collapsed, onset=onset,
        signals={"ess_ratio": ess, "grad_norm": [0.2] * n, "is_weight_max": [1.0] * n, "kl": [0.0] * n},
    )  # fmt: skip


def test_onset_is_the_first_eval_from_which_accuracy_stays_down() -> None:
    assert _onset([9, 19, 29, 39], [0.5, 0.1, 0.3, 0.1], [0.25] * 4) == 39  # recovered at 29: onset is 39
    assert _onset([9, 19, 29, 39], [0.5, 0.1, 0.1, 0.1], [0.25] * 4) == 19


def test_precision_recall_and_lead_count_late_warnings_as_misses_not_false_alarms() -> None:
    healthy, low = [0.9] * 20, [0.01] * 20
    runs = [
        _run("early", healthy[:5] + low[:15], collapsed=True, onset=19),  # warns at 6: lead 13
        _run("late", healthy[:16] + low[:4], collapsed=True, onset=19),  # warns at 17: lead 2 < 5
        _run("silent", healthy, collapsed=True, onset=19),
        _run("false alarm", healthy[:10] + low[:2] + healthy[:8], collapsed=False, onset=None),
        _run("quiet", healthy, collapsed=False, onset=None),
    ]
    sc = Batch(runs).score(TH)
    assert (sc.warned, sc.true_warned, sc.in_time, sc.false_alarms) == (3, 2, 1, 1)
    assert sc.leads == [13, 2]
    assert sc.precision == 2 / 3 and sc.recall == 1 / 3


def test_lag_baseline_warns_every_run_at_or_above_its_lag() -> None:
    runs = [
        _run(f"k{k}", [0.9] * 10, collapsed=k >= 8, onset=9 if k >= 8 else None, lag=k) for k in (2, 4, 8, 16)
    ]
    out = lag_baseline(runs, runs)
    assert out["k_min"] == 8 and out["evaluation"]["precision"] == 1.0 and out["evaluation"]["recall"] == 1.0


def test_seed_split_falls_back_to_the_last_seed_for_evaluation() -> None:
    runs = [_run("r", [0.9], collapsed=False, onset=None, seed=s) for s in (0, 1, 2)]
    assert split_seeds(runs) == ([0, 1], [2])
    runs += [_run("r", [0.9], collapsed=False, onset=None, seed=s) for s in (3, 4)]
    assert split_seeds(runs) == ([0, 1, 2], [3, 4])


def test_a_fixed_lag_run_is_scored_by_its_learner_policy_not_the_lagged_engine_eval() -> None:
    """Under fixed_lag=k the periodic eval measures the engines' policy, k steps old: the final checkpoint's eval
    decides the final accuracy, and the curve is placed at the step it measured (a packed level (b) run)."""
    r0 = {"lag": 2, "steps": list(range(6)), "eval_steps": [5], "eval_accuracy": [0.7], "final_accuracy": 0.0}
    r1 = r0 | {"eval_accuracy": [0.6], "final_accuracy": None}  # no final eval: the last periodic one
    assert final_accuracy(r0) == 0.0 and final_accuracy(r1) == 0.6
    assert policy_curve(r0) == ([3, 5], [0.7, 0.0])  # eval after step 5 ran version 6-2=4: step 3's policy
    assert policy_curve(r1) == ([3], [0.6])
