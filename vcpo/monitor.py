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
quiet); a run of them is the pattern.

Those signals compare the learner's policy with the one that sampled; a policy that walks off a cliff
one small step at a time passes them all (the main job's collapse of 2026-12-06: tool use fell from
most episodes to none in three steps with the ESS above 0.3). `RewardWatch` looks at the outcome
instead: the training reward's moving average, against the rise it has made so far,

    ema_t     = s x reward_t + (1 - s) x ema_{t-1}             (s = `smoothing`)
    peak      = the largest ema so far;  trough = the smallest ema before it
    give-back = (peak - ema_t) / (peak - trough)                (judged once peak - trough >= `min_rise`,
                                                                 after `warmup` batches)
    warning   = give-back >= `giveback`

so a run that learnt and then lost most of what it learnt warns, whatever the importance weights say.
`min_rise` is in reward units, for rewards in [0, 1]: scale it for a reward of another range.

Thresholds and window are data, not constants of nature: `benchmarks/stress/monitor_eval.py` chooses the
signals' on calibration runs of the staleness study and reports precision, recall and lead time on
separate evaluation runs, and scores the reward watch at the loop's defaults
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

    @property
    def since(self) -> int:
        """The newest step whose weights are not suspect: the first step of the window."""
        return self.step - self.window + 1

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


@dataclass(frozen=True)
class RewardThresholds:
    """When the training reward's fall warns (`RewardWatch`)."""

    giveback: float = math.inf
    """Warn when the moving average has given back this share of its rise (inf: off)."""
    smoothing: float = 0.5
    """Weight of the newest batch's mean reward in the moving average."""
    min_rise: float = 0.1
    """No judgement before the moving average has risen this much (reward units) above its trough."""
    warmup: int = 5
    """Batches before the first judgement."""

    def __post_init__(self) -> None:
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"RewardThresholds.smoothing must be in (0, 1], got {self.smoothing}")
        if not self.giveback > 0 or self.min_rise < 0 or self.warmup < 0:
            raise ValueError(f"RewardThresholds: need giveback > 0, min_rise >= 0, warmup >= 0, got {self}")


@dataclass(frozen=True)
class RewardDrop:
    """The training reward gave back most of its rise."""

    step: int
    ema: float
    trough: float
    peak: float
    peak_step: int
    since: int
    """The newest step whose weights are not suspect: the oldest policy version in the peak's batch (a
    checkpoint taken at or before this step holds weights no newer than that version)."""
    giveback: float

    @property
    def reasons(self) -> tuple[str, ...]:
        return (
            f"training reward (moving average) {self.ema:.3f} gave back {self.giveback:.0%} of its rise "
            f"from {self.trough:.3f} to {self.peak:.3f} (step {self.peak_step})",
        )

    def message(self) -> str:
        return f"reward collapse at step {self.step}: {self.reasons[0]}"


class RewardWatch:
    """Streaming: `update` once per trained batch with its mean reward and its oldest sampling version."""

    def __init__(self, thresholds: RewardThresholds):
        self.th = thresholds
        self.ema: float | None = None
        self.seen = 0
        self.low = math.inf  # smallest ema so far
        self.peak = -math.inf
        self.trough = math.inf  # smallest ema before the peak
        self.peak_step = -1
        self.peak_version = 0

    def giveback(self) -> float:
        """Share of the rise given back now; 0 while there is no rise to judge."""
        rise = self.peak - self.trough
        if self.ema is None or self.seen <= self.th.warmup or rise < self.th.min_rise or rise <= 0:
            return 0.0
        return (self.peak - self.ema) / rise

    def update(self, step: int, reward: float, sampled_by: int) -> RewardDrop | None:
        if not math.isfinite(reward):
            raise ValueError(f"RewardWatch: step {step}'s mean reward is {reward}")
        s = self.th.smoothing
        self.ema = reward if self.ema is None else s * reward + (1 - s) * self.ema
        self.seen += 1
        self.low = min(self.low, self.ema)
        if self.ema > self.peak:
            self.peak, self.trough, self.peak_step, self.peak_version = self.ema, self.low, step, sampled_by
        g = self.giveback()
        if g < self.th.giveback:
            return None
        return RewardDrop(step, self.ema, self.trough, self.peak, self.peak_step, self.peak_version, g)

    def restart(self) -> None:
        """After a rollback: a new moving average, judged after `warmup` batches again (one batch of the
        restored policy is too noisy to judge); the peak and trough stay the reference."""
        self.ema, self.seen = None, 0
