"""VCPO as a standalone torch library: IS weights, ESS, the off-policy optimal baseline,
the comparison losses and a trainer-facing step driver. Imports torch only."""

from vcpo.advantages import ADVANTAGES, group_stats, grpo_advantages, rloo_advantages
from vcpo.baseline import opob_baseline
from vcpo.batch import BatchError, PolicyBatch
from vcpo.logprobs import logit_grad_proxy_of, logprobs_of
from vcpo.losses import LOSSES, LossInputs, LossOutput, LossSpec, get_loss
from vcpo.step import Step, StepConfig, StepMetrics, VCPOStep
from vcpo.weights import effective_sample_size, ess_lr_scale, sequence_log_weights, truncated_log_weights

__all__ = [
    "ADVANTAGES",
    "LOSSES",
    "BatchError",
    "LossInputs",
    "LossOutput",
    "LossSpec",
    "PolicyBatch",
    "Step",
    "StepConfig",
    "StepMetrics",
    "VCPOStep",
    "effective_sample_size",
    "ess_lr_scale",
    "get_loss",
    "group_stats",
    "grpo_advantages",
    "logit_grad_proxy_of",
    "logprobs_of",
    "opob_baseline",
    "rloo_advantages",
    "sequence_log_weights",
    "truncated_log_weights",
]
