"""Collapse early warning from the step's own statistics: ESS, gradient norm, IS-weight tail, KL.

The paper's diagnosis is that a run collapsing under staleness shows it in the importance
weights (the effective sample size falls, the largest weight and KL(behaviour || current) grow)
and in unstable gradient norms, before held-out accuracy falls. `CollapseMonitor` reads those
numbers once per step and warns when they have looked unhealthy for most of a recent window:

    unhealthy step = ESS/B < ess_floor
                  or grad_norm > grad_spike x (median grad norm of the first `warmup` steps)
                  or KL(behaviour || current) per token > kl_ceiling
                  or max IS weight > is_weight_ceiling
                  or any of them is not finite
    warning        = at least `min_unhealthy` unhealthy steps among the last `window`

One step's spike is noise at these batch sizes (tests/vcpo/test_monitor.py: healthy noise stays
quiet); a run of them is the pattern. Thresholds and window are data, not constants of nature:
`benchmarks/stress/monitor_eval.py` chooses them on calibration runs of the staleness study and
reports precision, recall and lead time on separate evaluation runs
(benchmarks/results/stress/monitor.md). Depends on the standard library only (any trainer can feed it floats); the batch form over whole
runs is the study's (benchmarks/stress/signals.py).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class MonitorThresholds:
    """When a step counts as unhealthy, and how many unhealthy steps make a warning."""

    window: int = 10
    """Steps the warning looks back over."""
    min_unhealthy: int = 5
    """Unhealthy steps within `window` that raise the warning."""
    warmup: int = 5
    """Steps whose median gradient norm is the reference for `grad_spike` (no grad criterion before)."""
    ess_floor: float = 0.1
    """ESS/B below this is unhealthy (1/B: one trajectory carries the whole batch)."""
    grad_spike: float = math.inf
    """Gradient norm above this multiple of the warm-up reference is unhealthy (inf: criterion off)."""
    kl_ceiling: float = math.inf
    """KL(behaviour || current) per token above this is unhealthy (inf: off)."""
    is_weight_ceiling: float = math.inf
    """Largest (untruncated) IS weight above this is unhealthy (inf: off)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_unhealthy <= self.window:
            raise ValueError(
                f"MonitorThresholds: need 1 <= min_unhealthy <= window, got {self.min_unhealthy} and {self.window}"
            )
        if self.warmup < 1:
            raise ValueError(f"MonitorThresholds.warmup must be >= 1, got {self.warmup}")


@dataclass(frozen=True)
class StepSignals:
    """One learner step's statistics, as vcpo.StepMetrics reports them."""

    ess_ratio: float
    grad_norm: float
    is_weight_max: float = 1.0
    kl: float = 0.0


@dataclass(frozen=True)
class CollapseWarning:
    step: int
    unhealthy: int
    window: int
    reasons: tuple[str, ...]
    """Which criteria the latest step tripped, with the value and the threshold."""

    def message(self) -> str:
        why = "; ".join(self.reasons) or "earlier steps"
        return (
            f"collapse warning at step {self.step}: {self.unhealthy} of the last {self.window} steps unhealthy "
            f"(latest: {why})"
        )


class CollapseMonitor:
    """Streaming form: `update` once per learner step; returns a warning while the pattern holds."""

    def __init__(self, thresholds: MonitorThresholds):
        self.th = thresholds
        self._recent: deque[bool] = deque(maxlen=thresholds.window)
        self._warmup_grads: list[float] = []
        self.grad_reference: float | None = None
        self.first_warning: CollapseWarning | None = None

    def reasons(self, s: StepSignals) -> tuple[str, ...]:
        th, out = self.th, []
        if not all(math.isfinite(x) for x in (s.ess_ratio, s.grad_norm, s.is_weight_max, s.kl)):
            out.append(f"non-finite signal {s}")
        if s.ess_ratio < th.ess_floor:
            out.append(f"ESS/B {s.ess_ratio:.3f} < {th.ess_floor:g}")
        ref = self.grad_reference
        if ref is not None and s.grad_norm > th.grad_spike * ref:
            out.append(f"grad norm {s.grad_norm:.3g} > {th.grad_spike:g} x {ref:.3g}")
        if s.kl > th.kl_ceiling:
            out.append(f"KL {s.kl:.3g} > {th.kl_ceiling:g}")
        if s.is_weight_max > th.is_weight_ceiling:
            out.append(f"max IS weight {s.is_weight_max:.3g} > {th.is_weight_ceiling:g}")
        return tuple(out)

    def update(self, step: int, signals: StepSignals) -> CollapseWarning | None:
        why = self.reasons(signals)
        self._recent.append(bool(why))
        if self.grad_reference is None:
            self._warmup_grads.append(signals.grad_norm)
            if (
                len(self._warmup_grads) == self.th.warmup
            ):  # median of the finite ones among the first `warmup`
                finite = [g for g in self._warmup_grads if math.isfinite(g)]
                self.grad_reference = statistics.median(finite) if finite else math.inf
        bad = sum(self._recent)
        if bad < self.th.min_unhealthy:
            return None
        warning = CollapseWarning(step, bad, self.th.window, why)
        if self.first_warning is None:
            self.first_warning = warning
        return warning

    def reset(self) -> None:
        """Forget the window (after a rollback: the restored weights start clean); keep the reference."""
        self._recent.clear()
        self.first_warning = None
