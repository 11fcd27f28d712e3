"""The monitor's unhealthy-step rule in batch form over whole runs ([..., steps] arrays), for scoring
thresholds offline on the staleness study's logged runs; the same rule as `vcpo.monitor.CollapseMonitor`
(tests/vcpo/test_monitor.py checks they warn at the same step)."""

from __future__ import annotations

import numpy as np

from vcpo.monitor import MonitorThresholds


def unhealthy_steps(
    th: MonitorThresholds,
    ess_ratio: np.ndarray,
    grad_norm: np.ndarray,
    is_weight_max: np.ndarray,
    kl: np.ndarray,
) -> np.ndarray:
    """Batch form of the unhealthy-step rule over [..., steps] arrays (the same rule as `CollapseMonitor`)."""
    signals = np.stack([ess_ratio, grad_norm, is_weight_max, kl])
    bad = ~np.isfinite(signals).all(axis=0)
    bad |= ess_ratio < th.ess_floor
    finite_grads = np.where(np.isfinite(grad_norm), grad_norm, np.nan)
    ref = np.nanmedian(finite_grads[..., : th.warmup], axis=-1, keepdims=True)
    after_warmup = np.arange(grad_norm.shape[-1]) >= th.warmup
    with np.errstate(invalid="ignore"):
        bad |= after_warmup & (grad_norm > th.grad_spike * ref)
        bad |= kl > th.kl_ceiling
        bad |= is_weight_max > th.is_weight_ceiling
    return bad


def first_warning_index(th: MonitorThresholds, unhealthy: np.ndarray) -> np.ndarray:
    """Per row of a [..., steps] unhealthy mask: index of the first step that warns, or -1."""
    counts = np.cumsum(unhealthy, axis=-1)
    shifted = np.concatenate([np.zeros_like(counts[..., : th.window]), counts[..., : -th.window]], axis=-1)[
        ..., : counts.shape[-1]
    ]
    warns = (counts - shifted) >= th.min_unhealthy
    return np.where(warns.any(axis=-1), warns.argmax(axis=-1), -1)
