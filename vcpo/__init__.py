"""VCPO as a standalone torch library: IS weights, ESS, the off-policy optimal baseline,
the comparison losses and a trainer-facing step driver. Imports torch only, and only when a name
that needs it is first used (`import vcpo.monitor` stays numpy-only)."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "vcpo.advantages": ("ADVANTAGES", "group_stats", "grpo_advantages", "rloo_advantages"),
    "vcpo.baseline": ("opob_baseline",),
    "vcpo.batch": ("BatchError", "PolicyBatch"),
    "vcpo.logprobs": ("logit_grad_proxy_of", "logprobs_of"),
    "vcpo.losses": ("LOSSES", "LossInputs", "LossOutput", "LossSpec", "get_loss"),
    "vcpo.step": ("Step", "StepConfig", "StepMetrics", "VCPOStep"),
    "vcpo.importance": (
        "effective_sample_size",
        "ess_lr_scale",
        "sequence_log_weights",
        "truncated_log_weights",
    ),  # fmt: skip
}
_MODULE = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE)


def __getattr__(name: str) -> Any:
    if name not in _MODULE:
        raise AttributeError(f"module 'vcpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE[name]), name)
    globals()[name] = value
    return value
