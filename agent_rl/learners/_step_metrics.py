"""What a learner step reports, shared by both backends so their metrics line up key for key."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from vcpo.advantages import STD_EPS
from vcpo.batch import PolicyBatch

if TYPE_CHECKING:
    from agent_rl.types import Group

log = logging.getLogger(__name__)

_NAMES = {
    "loss": "learner/loss",
    "grad_norm": "learner/grad_norm",
    "lr": "learner/lr_effective",
    "tokens": "learner/tokens",
    "trajectories": "learner/trajectories",
}


def skip_if_all_masked(shares: Sequence[PolicyBatch], version: int) -> dict[str, float] | None:
    """A batch without a single loss token (every trajectory masked, e.g. all void turns) is no update:
    its metrics, or None when the batch has something to learn from."""
    if any(float(b.loss_mask.sum()) > 0 for b in shares):
        return None
    log.warning("learner: every trajectory of the batch is masked; no update (version stays %d)", version)
    return {"learner/skipped": 1.0, "learner/tokens": 0.0}


def skip_if_no_signal(groups: Sequence[Group], version: int) -> dict[str, float] | None:
    """A batch in which every group's rewards are equal (each group's reward std at most vcpo's STD_EPS) has every
    advantage 0 under every baseline (grpo, rloo, opob: each is a weighted mean of the group's own rewards), so its
    policy gradient is exactly 0. Stepping AdamW on it would still move the weights by the momentum of earlier
    steps, with nothing in this batch behind the move; that drift, step after step, is how the main job collapsed
    at lr 5e-4 (docs/benchmarks/main-job.md). So no update: its metrics, or None when some group has a signal."""
    if any(len(g.rewards) > 1 and statistics.pstdev(g.rewards) > STD_EPS for g in groups):
        return None
    log.info("learner: every group's rewards are equal (no signal); no update (version stays %d)", version)
    return {"learner/skipped": 1.0, "learner/no_signal": 1.0, "learner/tokens": 0.0}


def step_metrics(raw: Mapping[str, float], shares: Sequence[PolicyBatch], seconds: float) -> dict[str, float]:
    """vcpo's StepMetrics (as a rank returned them) under their logged names, plus throughput."""
    metrics = {  # keys with a prefix of their own (distill/...) keep it
        _NAMES.get(k, k if "/" in k else f"vcpo/{k}"): float(v) for k, v in raw.items() if k != "lr_scheduled"
    }
    n_tokens = sum(int(b.attention_mask.sum()) for b in shares)
    return metrics | {
        "learner/lr": float(raw["lr_scheduled"]),
        "learner/skipped": 0.0,
        "learner/no_signal": 0.0,
        "learner/input_tokens": float(n_tokens),
        "learner/step_seconds": seconds,
        "perf/learner_tokens_per_s": n_tokens / seconds,
    }
