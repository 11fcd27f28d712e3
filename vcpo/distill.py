"""On-policy distillation: the per-token reverse KL to a teacher, as a term beside the policy loss.

The student samples; a teacher scores each sampled token y_t (log π_T(y_t), log-probs only: no
teacher logits ever reach the learner). Per token, the reverse KL KL(π‖π_T) is estimated on the
student's own sample by

    k_t = log π(y_t) − log π_T(y_t)          (current policy π, detached where it is a coefficient)

and its gradient, each token's KL counted at its own position (discount 0, as Thinking Machines'
recipe), is E_π[k_t ∇log π(y_t)]. Rollouts sampled by μ, k versions behind π, carry the importance
weight that VCPO computes for the task loss, w̃_i = min(Π_t π/μ, c) (sequence level, truncated; the
loss's own `seq_log_weight`, so `mis` rejects and `reinforce` leaves uncorrected as it does for the
task term; token-level losses get the truncated sequence weight), and the step's ESS-scaled lr:

    ∇ℓ^D_i = β w̃_i mean_t k_{i,t} ∇log π(y_{i,t})          (mean over loss tokens, like the task loss)

Two forms with that same gradient (tests/vcpo/test_distill.py checks both against a hand-computed one):

- ``reward``: the policy-gradient form, a dense per-token advantage a_t = −β k_t (detached):
  ℓ^D = −w̃ mean_t a_t log π_t. Tinker, slime and TRL's OPD take k from the sampler's log-probs;
  here it is the current policy's, the same number at k=0 and the one whose IS-weighted estimate
  is the current policy's reverse-KL gradient when rollouts are stale.
- ``loss``: the k2 loss ℓ^D = β w̃ mean_t ½ (log π_t − log π_T,t)², differentiable through log π
  alone; its value is a non-negative, KL-like number that reaches 0 when student and teacher agree.

The task loss keeps its own advantage, scaled by ``task_weight`` (0: distillation alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

DISTILL_MODES = ("reward", "loss")


@dataclass(frozen=True)
class DistillConfig:
    """The distillation term of a step (None in StepConfig: no teacher)."""

    mode: str = "reward"  # reward | loss (see the module docstring)
    weight: float = 1.0  # β
    task_weight: float = 1.0  # multiplies the task advantage; 0: distillation alone
    disagree_threshold: float = math.log(10.0)  # k_t above this: a token the teacher disagrees with

    def check(self) -> None:
        if self.mode not in DISTILL_MODES:
            raise ValueError(f"DistillConfig.mode = {self.mode!r}; expected one of {DISTILL_MODES}")
        for name in ("weight", "task_weight", "disagree_threshold"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"DistillConfig.{name} must be a finite number >= 0, got {v!r}")
        if self.weight == 0 and self.task_weight == 0:
            raise ValueError("DistillConfig: weight and task_weight are both 0: nothing would be trained")


@dataclass(frozen=True)
class DistillOutput:
    """Per trajectory ([b]): the loss term and float64 sums over its loss tokens, for metrics."""

    loss: Tensor  # ℓ^D_i, differentiable
    reverse_kl: Tensor  # Σ_t k_t (current policy)
    teacher_logprob: Tensor  # Σ_t log π_T
    behavior_logprob: Tensor  # Σ_t log μ
    disagree: Tensor  # tokens with k_t > disagree_threshold


def distill_term(
    logprobs: Tensor,
    teacher_logprobs: Tensor,
    behavior_logprobs: Tensor,
    loss_mask: Tensor,
    log_weight: Tensor,
    cfg: DistillConfig,
) -> DistillOutput:
    """ℓ^D_i for rows of [b, T] log-probs (``logprobs`` differentiable) and per-row log w̃ ([b], -inf: 0)."""
    mask = loss_mask > 0
    lt = teacher_logprobs.to(logprobs.dtype)
    k = torch.where(mask, logprobs.detach() - lt, 0.0)
    w = torch.exp(log_weight.detach()).to(logprobs.dtype)[:, None]
    # reward: −w̃ a_t log π_t with the constant a_t = −k_t; loss: w̃ ½ (log π_t − log π_T,t)²
    per_token = (w * k) * logprobs if cfg.mode == "reward" else w * 0.5 * (logprobs - lt) ** 2
    count = loss_mask.sum(-1).clamp(min=1.0)
    loss = cfg.weight * (torch.where(mask, per_token, 0.0)).sum(-1) / count
    k64 = k.detach().double()
    return DistillOutput(
        loss=loss,
        reverse_kl=k64.sum(-1),
        teacher_logprob=torch.where(mask, teacher_logprobs.double(), 0.0).sum(-1),
        behavior_logprob=torch.where(mask, behavior_logprobs.double(), 0.0).sum(-1),
        disagree=((k64 > cfg.disagree_threshold) & mask).double().sum(-1),
    )
