"""The offline scoring of the collapse warning, and the level (b) comparison's arithmetic, on hand-built runs."""

from __future__ import annotations

import math

from benchmarks.stress.level_b_report import comparison
from benchmarks.stress.monitor_eval import Batch, RunSeries, _onset, lag_baseline, split_seeds
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


def _b(method: str, lag: int, seed: int, final: float) -> dict:
    return {"method": method, "lag": lag, "seed": seed, "eval_accuracy": [0.5, final], "eval_steps": [9, 19]}


def test_level_b_comparison_k_star_borrowed_k0_rows_and_vcpo_against_the_best_baseline() -> None:
    runs = [_b("plain_nomaskvoid", 0, s, 0.7) for s in range(2)]
    runs += [_b("vcpo_nomaskvoid", 0, s, 0.7) for s in range(2)]
    runs += [_b("plain_nomaskvoid", 8, s, f) for s, f in enumerate((0.0, 0.1))]
    runs += [_b("tis_nomaskvoid", 8, s, f) for s, f in enumerate((0.6, 0.62))]
    runs += [_b("vcpo_nomaskvoid", 8, s, f) for s, f in enumerate((0.68, 0.7))]
    cmp = comparison(runs)
    assert cmp["sync"] == 0.7
    assert cmp["table"]["tis_nomaskvoid"][0]["same_as_plain"]  # k = 0 of tis is plain's run
    assert cmp["table"]["plain_nomaskvoid"][8]["collapsed"] == 2
    assert cmp["k_star"] == {"plain_nomaskvoid": 0, "tis_nomaskvoid": 0, "vcpo_nomaskvoid": 8}  # 0.61 < 0.63
    v = cmp["vcpo_vs_best_baseline"][8]
    assert v["best_baseline"] == "tis_nomaskvoid" and abs(v["difference"] - 0.08) < 1e-9 and v["separated"]
