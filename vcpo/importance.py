"""Sequence importance weights, effective sample size and the ESS learning-rate rule.

Everything is kept in log space: a trajectory a few versions stale easily has a sequence
log-ratio of hundreds, and exp() of that overflows float32 (and, at |s| = 1e4, float64).
The reference computes ESS from exponentiated weights, so one overflow makes ESS NaN and
``min(1, nan)`` silently removes all damping; here ESS is a log-sum-exp and never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

ESS_RULES = ("sqrt", "linear", "none")


def sequence_log_weights(logp: Tensor, behavior_logp: Tensor, mask: Tensor, *, check: bool = True) -> Tensor:
    """s_i = Σ_t mask·(log π − log μ) in float64, one per trajectory ([B, T] -> [B]).

    Tokens outside the mask are ignored whatever they hold (padding may carry -inf or 0).
    A -inf current log-prob on a loss token gives s = -inf (weight 0); a -inf *behaviour*
    log-prob would give +inf and is refused, since the sampler cannot have drawn that token.
    `check=False` leaves that check (a read of the result, which on a GPU waits for the device) to the caller.
    """
    if logp.shape != behavior_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"sequence_log_weights: shapes differ: logp {tuple(logp.shape)}, "
            f"behavior_logp {tuple(behavior_logp.shape)}, mask {tuple(mask.shape)}"
        )
    keep = mask > 0
    diff = torch.where(keep, logp.double() - behavior_logp.double(), torch.zeros((), dtype=torch.float64))
    s = diff.sum(dim=-1)
    if not check:
        return s
    bad = torch.isnan(s) | (s == math.inf)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"sequence_log_weights: trajectory {i} has log-ratio {float(s[i])}: a loss token has a "
            "NaN or -inf behaviour log-prob (behavior_logprobs must be finite wherever mask is 1)"
        )
    return s


def _check_log_weights(log_w: Tensor, who: str) -> Tensor:
    lw = log_w.detach().double().flatten()
    bad = torch.isnan(lw) | (lw == math.inf)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{who}: log-weight {i} is {float(lw[i])}; log-weights must be finite or -inf")
    return lw


def effective_sample_size(log_w: Tensor, group: dist.ProcessGroup | None = None) -> tuple[float, float]:
    """(ESS, ESS / B_global) for weights exp(log_w), reduced over ``group`` when given.

    ESS = (Σw)² / Σw² = exp(2·LSE(s) − LSE(2s)), computed after shifting by the global max
    log-weight so the largest weight is exactly 1: the sums are then in [1, B] and neither
    overflows nor underflows. Equal weights give B; one dominating weight gives 1.
    """
    lw = _check_log_weights(log_w, "effective_sample_size")
    local_max = lw.max() if lw.numel() else torch.tensor(-math.inf, dtype=torch.float64, device=lw.device)
    m = local_max.reshape(1).clone()
    if group is not None:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(lw - m) if bool(torch.isfinite(m)) else torch.zeros_like(lw)
    sums = torch.stack(
        [e.sum(), (e * e).sum(), torch.tensor(float(lw.numel()), dtype=torch.float64, device=lw.device)]
    )
    if group is not None:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    return ess_from_sums(float(m), float(sums[0]), float(sums[1]), int(sums[2]))


def ess_from_sums(shift: float, sum_w: float, sum_w2: float, n: int) -> tuple[float, float]:
    """ESS from already-reduced shifted sums Σexp(s−m), Σexp(2(s−m)) and the count n."""
    if n == 0:
        raise ValueError("effective_sample_size: no weights (empty batch over all ranks)")
    if shift == -math.inf or sum_w2 <= 0.0:
        raise ValueError(
            f"effective_sample_size: all {n} weights are zero (every log-weight is -inf): "
            "the current policy gives probability 0 to every sampled trajectory"
        )
    ess = min(sum_w * sum_w / sum_w2, float(n))
    return ess, ess / n


def ess_lr_scale(ess_ratio: float, rule: str = "sqrt", base_ratio: float = 1.0) -> float:
    """Learning-rate multiplier for one step: sqrt(min(1, ρ/ρ₀)), min(1, ρ/ρ₀) or 1.

    sqrt is the rule for Adam-style optimizers (the step size scales with the square
    root of the effective batch); ρ₀ < 1 leaves batches with ESS ratio above ρ₀ undamped.
    """
    if rule not in ESS_RULES:
        raise ValueError(f"ess_lr_scale: rule {rule!r} is not one of {ESS_RULES}")
    if not base_ratio > 0.0 or not math.isfinite(base_ratio):
        raise ValueError(f"ess_lr_scale: base_ratio must be a positive number, got {base_ratio}")
    if not math.isfinite(ess_ratio) or ess_ratio < 0.0:
        raise ValueError(f"ess_lr_scale: ess_ratio must be a finite number >= 0, got {ess_ratio}")
    if rule == "none":
        return 1.0
    r = min(1.0, ess_ratio / base_ratio)
    return math.sqrt(r) if rule == "sqrt" else r


def truncated_log_weights(s: Tensor, truncation: float) -> Tensor:
    """log w̃ = log min(exp(s), c) = min(s, log c): the weight that multiplies the loss."""
    if not truncation > 0.0:
        raise ValueError(f"IS truncation must be > 0, got {truncation}")
    return torch.clamp(s, max=math.log(truncation))
