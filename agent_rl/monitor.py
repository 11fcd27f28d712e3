"""The training loop's collapse monitor: vcpo.monitor's early warning, and what the loop does about it.

Two detectors feed one response: `CollapseMonitor` (the importance weights and gradients of each trained
step, windowed) and `RewardWatch` (the training reward's moving average giving back most of its rise;
fed every batch, a skipped one too, except batches holding samples of weights a rollback discarded).

`monitor.on_warning` (agent_rl/config.py: MonitorConfig):
- log (default): metrics `monitor/warning` (1 while the pattern holds) and `monitor/unhealthy`; the
  first warning is printed once;
- stop: the loop checkpoints and stops, printing one line that says why and what to change;
- rollback: reload the newest checkpoint from before the unhealthy window, or for a reward warning from
  before the policy that sampled the reward's peak (weights, optimizer,
  lr schedule, and under fixed_lag the engines' lagged weights), lower the lr by
  `rollback_lr_factor`, go on (after `max_rollbacks`, the next warning stops the run);
- adapt_staleness: the buffer's staleness bound follows the ESS every step: when ESS/B is below
  `adapt_ess_floor` it becomes half the largest staleness in the batch (or of the bound, if lower);
  a warning sets it to 0; it is raised by 1 (up to buffer.max_staleness) after `adapt_patience`
  healthy steps in a row. `buffer/staleness_bound` logs the bound in force.

Versions only go up: a rollback publishes the restored weights as a new version (current + 1), so the
buffer's staleness arithmetic and the engines' version stay monotonic.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent_rl import checkpoint
from agent_rl.config import MonitorConfig
from vcpo.monitor import (
    CollapseMonitor,
    CollapseWarning,
    MonitorThresholds,
    RewardDrop,
    RewardThresholds,
    RewardWatch,
    StepSignals,
)

if TYPE_CHECKING:
    from agent_rl.learners.facade import RankLearner
    from agent_rl.weight_sync.publish import Publisher

SIGNAL_KEYS = {  # StepSignals field -> the learner's metric
    "ess_ratio": "vcpo/ess_ratio",
    "grad_norm": "learner/grad_norm",
    "is_weight_max": "vcpo/is_weight_max",
    "kl": "vcpo/kl_behavior_current",
}


def thresholds(cfg: MonitorConfig) -> MonitorThresholds:
    return MonitorThresholds(
        window=cfg.window,
        min_unhealthy=cfg.min_unhealthy,
        warmup=cfg.warmup,
        ess_floor=cfg.ess_floor,
        grad_spike=math.inf if cfg.grad_spike is None else cfg.grad_spike,
        kl_ceiling=math.inf if cfg.kl_ceiling is None else cfg.kl_ceiling,
        is_weight_ceiling=math.inf if cfg.is_weight_ceiling is None else cfg.is_weight_ceiling,
    )


def reward_thresholds(cfg: MonitorConfig) -> RewardThresholds:
    return RewardThresholds(
        giveback=math.inf if cfg.reward_giveback is None else cfg.reward_giveback,
        smoothing=cfg.reward_smoothing,
        min_rise=cfg.reward_min_rise,
        warmup=cfg.warmup,
    )


MonitorWarning = CollapseWarning | RewardDrop


@dataclass
class Response:
    """What the loop does after this step."""

    metrics: dict[str, float]
    warning: MonitorWarning | None = None
    stop: bool = False
    rollback: bool = False
    staleness_bound: int | None = None  # adapt_staleness: the bound to put in force now
    message: str = ""


@dataclass
class LoopMonitor:
    cfg: MonitorConfig
    max_staleness: int
    detector: CollapseMonitor = field(init=False)
    rewards: RewardWatch = field(init=False)
    bound: int = field(init=False)
    healthy_streak: int = 0
    rollbacks: int = 0
    lr_scale: float = 1.0
    clean_from: int = 0  # batches with samples older than this version are not fed to `rewards`
    reward_warned: bool = False  # the current reward warning was printed

    def __post_init__(self) -> None:
        self.detector = CollapseMonitor(thresholds(self.cfg))
        self.rewards = RewardWatch(reward_thresholds(self.cfg))
        self.bound = self.max_staleness

    def observe(self, step: int, metrics: dict[str, float]) -> Response:
        """Feed one step's metrics. The reward is fed every step; the signals only on a trained step (a skipped
        one has no vcpo metrics)."""
        drop = self._reward(step, metrics)
        trained = SIGNAL_KEYS["ess_ratio"] in metrics
        first_before = self.detector.first_warning
        warning: MonitorWarning | None = None
        unhealthy = False
        if trained:
            signals = StepSignals(**{f: float(metrics[k]) for f, k in SIGNAL_KEYS.items()})
            unhealthy = bool(self.detector.reasons(signals))
            warning = self.detector.update(step, signals)
        new = (warning is not None and first_before is None) or (drop is not None and not self.reward_warned)
        warning = warning or drop
        out = Response(
            {
                "monitor/warning": float(warning is not None),
                "monitor/reward_giveback": self.rewards.giveback(),
                "monitor/rollbacks": float(self.rollbacks),
                "monitor/lr_scale": self.lr_scale,
            }
            | ({"monitor/unhealthy": float(unhealthy)} if trained else {})
        )
        out.warning = warning
        on = self.cfg.on_warning
        if on == "adapt_staleness" and trained:
            observed = metrics.get("learner/staleness_max")
            out.staleness_bound = self._adapt(
                float(metrics[SIGNAL_KEYS["ess_ratio"]]), warning, None if observed is None else int(observed)
            )
        if warning is None:
            return out
        self.reward_warned = self.reward_warned or drop is not None
        if new:
            print(f"monitor: {warning.message()} (monitor.on_warning={on})", file=sys.stderr, flush=True)
        if on == "stop" or (on == "rollback" and self.rollbacks >= self.cfg.max_rollbacks):
            out.stop = True
            extra = f" after {self.rollbacks} rollbacks" if on == "rollback" else ""
            out.message = (
                f"stopped by monitor.on_warning={on}{extra}: {warning.message()}. A checkpoint was saved; lower "
                "learner.lr or buffer.max_staleness (or use monitor.on_warning: adapt_staleness) and --resume"
            )
        elif on == "rollback":
            out.rollback = True
        return out

    def _reward(self, step: int, metrics: dict[str, float]) -> RewardDrop | None:
        """Feed the batch's mean reward unless the batch holds samples of weights a rollback discarded."""
        reward, oldest = metrics.get("rollout/reward_mean"), metrics.get("learner/batch_min_version")
        if reward is None or oldest is None or oldest < self.clean_from or not math.isfinite(reward):
            return None  # a non-finite mean reward is the metrics' to show, not a reason to stop
        return self.rewards.update(step, float(reward), int(oldest))

    def _adapt(self, ess_ratio: float, warning: MonitorWarning | None, observed: int | None) -> int:
        """`observed`: the largest staleness in the batch just trained. Low ESS halves the staleness that is
        actually delivered, not the nominal bound: a bound of 16 over batches 2 stale would otherwise take
        three halvings (three steps of the damage it reacts to) before it changed anything."""
        if warning is not None:
            self.bound, self.healthy_streak = 0, 0
        elif ess_ratio < self.cfg.adapt_ess_floor:
            in_force = self.bound if observed is None else min(self.bound, observed)
            self.bound, self.healthy_streak = in_force // 2, 0
        else:
            self.healthy_streak += 1
            if self.healthy_streak >= self.cfg.adapt_patience and self.bound < self.max_staleness:
                self.bound, self.healthy_streak = self.bound + 1, 0
        return self.bound

    def rollback(
        self, run_dir: Path, learner: RankLearner, publisher: Publisher, warning: MonitorWarning
    ) -> Path:
        """Restore the newest checkpoint taken at or before `warning.since` (the unhealthy window's first step;
        for a reward warning the oldest version that sampled the reward's peak), lr x rollback_lr_factor.
        Returns the checkpoint used. The caller pushes the weights and tells the buffer the new version."""
        path = checkpoint_before(run_dir, warning.since)
        if path is None:
            raise RuntimeError(
                f"monitor.on_warning=rollback at step {warning.step}: no checkpoint in {run_dir / 'checkpoints'}; "
                "set checkpoint.every (and checkpoint.keep) so one exists before the warning window"
            )
        version = learner.version
        state = checkpoint.load(path, learner)  # weights, optimizer, lr schedule, RNG; sets learner.version
        shift = version + 1 - learner.version
        learner.version = version + 1  # the restored weights are published as a new version
        self.lr_scale *= self.cfg.rollback_lr_factor
        learner.set_lr_scale(self.lr_scale)
        publisher.load_state(
            state.publisher, shift=shift
        )  # fixed_lag: the checkpoint's lagged weights, relabelled
        self.detector.reset()
        self.rewards.restart()
        self.clean_from, self.reward_warned = learner.version, False  # the restored weights' version
        self.rollbacks += 1
        late = int(path.name.removeprefix("step_")) > warning.since
        note = (
            f"; no checkpoint at or before step {warning.since} was kept, so this one may hold the weights that "
            "failed: raise checkpoint.keep"
            if late
            else ""
        )
        print(
            f"monitor: rolled back to {path} (lr x{self.lr_scale:g}, rollback {self.rollbacks}"
            f"/{self.cfg.max_rollbacks}){note}",
            file=sys.stderr,
            flush=True,
        )
        return path


def checkpoint_before(run_dir: Path, step: int) -> Path | None:
    """The newest complete checkpoint whose step is <= `step`; else the oldest kept one; None if none."""
    found = sorted(
        (int(p.name.removeprefix("step_")), p)
        for p in (Path(run_dir) / "checkpoints").glob("step_*")
        if p.is_dir() and (p / "loop.pkl").is_file()
    )
    if not found:
        return None
    before = [p for s, p in found if s <= step]
    return before[-1] if before else found[0][1]
