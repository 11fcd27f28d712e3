"""vcpo.monitor: the collapse early warning on synthetic series (collapse pattern vs healthy noise)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from benchmarks.stress.signals import first_warning_index, unhealthy_steps
from vcpo.monitor import CollapseMonitor, MonitorThresholds, StepSignals

TH = MonitorThresholds(
    window=10,
    min_unhealthy=5,
    warmup=5,
    ess_floor=0.1,
    grad_spike=3.0,
    kl_ceiling=0.5,
    is_weight_ceiling=50.0,
)


def _healthy(rng: random.Random) -> StepSignals:
    return StepSignals(
        ess_ratio=min(1.0, rng.uniform(0.4, 1.0)),
        grad_norm=rng.uniform(0.15, 0.3),
        is_weight_max=rng.uniform(1.0, 6.0),
        kl=rng.uniform(0.0, 0.2),
    )


def _collapsing(rng: random.Random) -> StepSignals:
    return StepSignals(
        ess_ratio=rng.uniform(0.008, 0.05),
        grad_norm=rng.uniform(0.8, 2.0),
        is_weight_max=rng.uniform(100.0, 1e4),
        kl=rng.uniform(0.6, 2.0),
    )


def _feed(mon: CollapseMonitor, series: list[StepSignals]) -> list[int]:
    return [step for step, s in enumerate(series) if mon.update(step, s) is not None]


def test_fires_within_min_unhealthy_steps_of_the_collapse_pattern_and_not_before() -> None:
    rng = random.Random(0)
    series = [_healthy(rng) for _ in range(40)] + [_collapsing(rng) for _ in range(20)]
    mon = CollapseMonitor(TH)
    warned = _feed(mon, series)
    assert mon.first_warning is not None
    # the 5th unhealthy step in the window is step 44: no earlier (healthy part), no later
    assert mon.first_warning.step == 40 + TH.min_unhealthy - 1
    assert warned == list(range(44, 60))
    assert any("ESS/B" in r for r in mon.first_warning.reasons)
    assert "collapse warning at step 44: 5 of the last 10 steps unhealthy" in mon.first_warning.message()


@pytest.mark.parametrize("seed", range(5))
def test_stays_quiet_on_healthy_noise_with_isolated_spikes(seed: int) -> None:
    """1000 healthy steps; every 7th step one signal spikes (ESS dip or grad spike): never 5 in 10."""
    rng = random.Random(seed)
    series = []
    for step in range(1000):
        s = _healthy(rng)
        if step % 7 == 3:
            s = StepSignals(0.02, s.grad_norm, s.is_weight_max, s.kl)
        if step % 7 == 5:
            s = StepSignals(s.ess_ratio, 10 * s.grad_norm, s.is_weight_max, s.kl)
        series.append(s)
    mon = CollapseMonitor(TH)
    assert _feed(mon, series) == []
    assert mon.first_warning is None


def test_grad_spike_is_measured_against_the_warmup_median() -> None:
    mon = CollapseMonitor(TH)
    for step, g in enumerate([0.1, 0.2, 0.3, 0.2, 0.2]):
        mon.update(step, StepSignals(1.0, g))
    assert mon.grad_reference == pytest.approx(0.2)
    assert mon.reasons(StepSignals(1.0, 0.59)) == ()
    assert mon.reasons(StepSignals(1.0, 0.61)) == ("grad norm 0.61 > 3 x 0.2",)


def test_a_non_finite_signal_is_unhealthy_not_ignored() -> None:
    mon = CollapseMonitor(TH)
    assert mon.reasons(StepSignals(1.0, math.nan))[0].startswith("non-finite signal")
    warned = _feed(mon, [StepSignals(1.0, math.inf)] * 10)
    assert warned[0] == 4


def test_reset_forgets_the_window_but_keeps_the_reference() -> None:
    rng = random.Random(1)
    mon = CollapseMonitor(TH)
    _feed(mon, [_healthy(rng) for _ in range(10)] + [_collapsing(rng) for _ in range(6)])
    ref = mon.grad_reference
    assert mon.first_warning is not None
    mon.reset()
    assert mon.first_warning is None and mon.grad_reference == ref
    assert mon.update(100, _collapsing(rng)) is None  # one unhealthy step after the reset is not a pattern


@pytest.mark.parametrize("seed", range(4))
def test_batch_form_warns_at_the_same_step_as_the_streaming_monitor(seed: int) -> None:
    rng = random.Random(seed)
    th = MonitorThresholds(window=6, min_unhealthy=3, warmup=4, ess_floor=0.2, grad_spike=2.0, kl_ceiling=0.3)
    runs = []
    for _ in range(8):
        onset = rng.randrange(10, 80)
        runs.append(
            [_healthy(rng) if t < onset or rng.random() < 0.3 else _collapsing(rng) for t in range(80)]
        )
    runs[0][2] = StepSignals(0.9, math.nan)  # a NaN inside the warm-up
    arr = {
        f: np.array([[getattr(s, f) for s in r] for r in runs])
        for f in ("ess_ratio", "grad_norm", "is_weight_max", "kl")
    }
    first = first_warning_index(
        th, unhealthy_steps(th, arr["ess_ratio"], arr["grad_norm"], arr["is_weight_max"], arr["kl"])
    )
    for r, idx in zip(runs, first, strict=True):
        mon = CollapseMonitor(th)
        warned = _feed(mon, r)
        assert (warned[0] if warned else -1) == idx


def test_thresholds_refuse_min_unhealthy_above_window() -> None:
    with pytest.raises(ValueError, match="need 1 <= min_unhealthy <= window, got 11 and 10"):
        MonitorThresholds(window=10, min_unhealthy=11)
