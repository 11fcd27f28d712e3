"""What a learner step reports, shared by both backends so their metrics line up key for key."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from vcpo.batch import PolicyBatch

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


def step_metrics(raw: Mapping[str, float], shares: Sequence[PolicyBatch], seconds: float) -> dict[str, float]:
    """vcpo's StepMetrics (as a rank returned them) under their logged names, plus throughput."""
    metrics = {  # keys with a prefix of their own (distill/...) keep it
        _NAMES.get(k, k if "/" in k else f"vcpo/{k}"): float(v) for k, v in raw.items() if k != "lr_scheduled"
    }
    n_tokens = sum(int(b.attention_mask.sum()) for b in shares)
    return metrics | {
        "learner/lr": float(raw["lr_scheduled"]),
        "learner/skipped": 0.0,
        "learner/input_tokens": float(n_tokens),
        "learner/step_seconds": seconds,
        "perf/learner_tokens_per_s": n_tokens / seconds,
    }
