"""vcpo.monitor.RewardWatch: the training reward giving back most of its rise, against hand computations."""

from __future__ import annotations

import math

import pytest

from vcpo.monitor import RewardThresholds, RewardWatch

TH = RewardThresholds(giveback=0.8, smoothing=0.5, min_rise=0.1, warmup=2)


def _feed(w: RewardWatch, rewards: list[float], start: int = 0) -> list[int]:
    """Steps that warned; batch i was sampled by version 10 + i (so `since` is readable)."""
    return [start + i for i, r in enumerate(rewards) if w.update(start + i, r, 10 + start + i) is not None]


def test_giveback_is_the_share_of_the_rise_lost_by_the_moving_average() -> None:
    w = RewardWatch(TH)
    # ema: 0.2, 0.6, 0.8 (peak, trough 0.2 before it), 0.4, 0.2
    assert _feed(w, [0.2, 1.0, 1.0]) == []
    assert (w.peak, w.trough, w.peak_step, w.peak_version) == (0.8, 0.2, 2, 12)
    assert w.update(3, 0.0, 13) is None  # ema 0.4: gave back (0.8 - 0.4) / 0.6 = 2/3 < 0.8
    assert w.giveback() == pytest.approx(2 / 3, rel=1e-12)  # a few float operations on values of order 1
    drop = w.update(4, 0.0, 14)  # ema 0.2: gave back all of it
    assert drop is not None
    assert (drop.step, drop.peak_step, drop.since) == (4, 2, 12)
    assert drop.giveback == pytest.approx(1.0, rel=1e-12)
    assert drop.message().startswith(
        "reward collapse at step 4: training reward (moving average) 0.200 gave back 100%"
    )


def test_the_trough_is_the_lowest_point_before_the_peak_not_after() -> None:
    w = RewardWatch(TH)
    _feed(w, [0.4, 0.0, 1.0, 1.0])  # ema 0.4, 0.2 (trough), 0.6, 0.8 (peak)
    assert (w.trough, w.peak) == (pytest.approx(0.2), pytest.approx(0.8))
    _feed(w, [0.0, 0.0, 0.0], start=4)  # ema 0.4, 0.2, 0.1: below the trough, which stays where it was
    assert w.trough == pytest.approx(0.2) and w.giveback() == pytest.approx((0.8 - 0.1) / 0.6)


def test_no_judgement_during_warmup_or_before_the_rise_reaches_min_rise() -> None:
    w = RewardWatch(RewardThresholds(giveback=0.5, smoothing=1.0, min_rise=0.1, warmup=3))
    # smoothing 1: the average is the batch itself. Steps 0-2 are warm-up: a fall there is not judged.
    assert _feed(w, [0.0, 0.9, 0.0]) == []
    assert w.update(3, 0.0, 13) is not None  # judged from the 4th batch on: rise 0.9, all given back

    flat = RewardWatch(RewardThresholds(giveback=0.5, smoothing=1.0, min_rise=0.1, warmup=0))
    # a flat run's noise (rise 0.05 < min_rise) never warns, however much of it is given back
    assert _feed(flat, [0.30, 0.35, 0.30, 0.35, 0.30] * 4) == []
    assert flat.giveback() == 0.0


def test_off_by_default_and_restart_waits_warmup_batches_keeping_the_peak() -> None:
    off = RewardWatch(RewardThresholds())
    assert _feed(off, [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]) == []  # giveback inf: off
    w = RewardWatch(TH)
    assert _feed(w, [0.2, 1.0, 1.0, 0.0, 0.0]) == [4]
    w.restart()
    # two warm-up batches after the restart are not judged, even at reward 0; the old peak is kept
    assert _feed(w, [0.0, 0.0], start=5) == []
    assert w.peak == pytest.approx(0.8) and w.update(7, 0.0, 17) is not None


def test_bad_thresholds_and_non_finite_rewards_are_refused() -> None:
    with pytest.raises(ValueError, match="smoothing must be in"):
        RewardThresholds(smoothing=0.0)
    with pytest.raises(ValueError, match="need giveback > 0"):
        RewardThresholds(giveback=-1.0)
    with pytest.raises(ValueError, match="step 3's mean reward is nan"):
        RewardWatch(TH).update(3, math.nan, 0)
