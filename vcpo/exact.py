"""Exact OPOB: one backward per trajectory and two running gradient sums, no per-trajectory copies.

For a prompt group g with member gradients g_i (of the token-mean log-likelihood, the term
the loss multiplies), IS weights w̃_i, rewards R_i, reward mean m and std σ:

    Σ_i w̃_i (R_i − b) g_i / σ  =  Σ_i w̃_i (R_i − m) g_i / σ  −  (b − m) Σ_i w̃_i g_i / σ

The first sum goes straight into ``acc`` (shared by all groups), the second into ``score``
(one group at a time); when the group's last member is done, b is known from the members'
‖g_i‖² and ``acc −= (b − m)·score``. Centring the rewards by m costs nothing and keeps the
subtraction well conditioned when σ is small. Memory: two gradient-sized buffers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vcpo.advantages import STD_EPS
from vcpo.baseline import opob_baseline
from vcpo.batch import PolicyBatch
from vcpo.importance import sequence_log_weights
from vcpo.losses import kl_k3_sum

LogprobFn = Callable[[nn.Module, Tensor, Tensor], Tensor]
GradSqFn = Callable[[list[Tensor]], float]  # ‖g‖² of this rank's gradient pieces (all-reduce over TP shards)


def local_grad_sq(grads: list[Tensor]) -> float:
    """Σ‖g‖² over the given gradients, accumulated in float64; a tensor-parallel trainer sums this over its TP
    group instead. One multi-tensor norm and one device sync per call (one per parameter kept a GPU host-bound:
    benchmarks/results/gpu_profile_2026-11-27.md)."""
    if not grads:
        return 0.0
    return float(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64)).pow(2).sum())


@dataclass
class TrajResult:
    """What the exact pass learns about one trajectory (floats, for metrics and the baseline)."""

    s: float
    log_wt: float
    mean_lp: float
    grad_sq: float  # ‖g_i‖², -1 when no backward was needed
    tokens: float
    kl: float  # k3 KL(μ‖π) summed over the loss tokens
    logprobs: Tensor  # [T] float32 current log π per token (CPU), for trajectory logs


def opob_weight_inputs(
    s: Tensor, log_wt: Tensor, tokens: Tensor, grad_sq: Tensor, variant: str
) -> tuple[Tensor, Tensor]:
    """(log_w, ‖g‖²) to pass to opob_baseline for the 'default' or 'reference' weight."""
    if variant == "default":
        return log_wt, grad_sq
    return log_wt + s, grad_sq * tokens.double() ** 2  # ‖∇Σ_t log π‖² = L² ‖∇ mean_t log π‖²


def _buffer(p: Tensor) -> Tensor:
    return torch.zeros_like(p, dtype=p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32)


def exact_opob_group(
    module: nn.Module,
    params: list[nn.Parameter],
    batch: PolicyBatch,
    members: Tensor,
    acc: list[Tensor],
    score: list[Tensor],
    *,
    logprob_fn: LogprobFn,
    seq_log_weight: Callable[[Tensor, float], Tensor],
    truncation: float,
    variant: str,
    grad_sq_fn: GradSqFn = local_grad_sq,
) -> tuple[Tensor, Tensor, list[TrajResult]]:
    """Back-propagate each member of one group, fold it into acc; return (advantage, baseline, results).

    Leaves ``p.grad`` of every parameter None. Members without loss tokens, or in a group
    whose rewards are all equal, get no backward (their advantage is exactly 0).
    """
    rewards = batch.rewards[members].double()
    mean = rewards.mean()
    std = rewards.std(unbiased=False) if len(members) > 1 else torch.zeros((), dtype=torch.float64)
    live = bool(std > STD_EPS)
    results: list[TrajResult] = []
    for k, i in enumerate(members.tolist()):
        sub = batch.select(torch.tensor([i], device=batch.input_ids.device))
        tokens = float(sub.loss_mask.sum())
        needs_grad = live and tokens > 0
        with torch.set_grad_enabled(needs_grad):
            lp = logprob_fn(module, sub.input_ids, sub.attention_mask)
        s = sequence_log_weights(lp.detach(), sub.behavior_logprobs, sub.loss_mask)
        log_wt = seq_log_weight(s, truncation)
        mean_lp = (lp * sub.loss_mask).sum() / max(tokens, 1.0)
        kl = float(kl_k3_sum(lp, sub.behavior_logprobs, sub.loss_mask))
        res = TrajResult(
            float(s), float(log_wt), float(mean_lp.detach()), -1.0, tokens, kl, lp.detach()[0].float().cpu()
        )
        results.append(res)
        if not needs_grad or res.log_wt == -math.inf:
            continue
        for p in params:
            p.grad = None
        mean_lp.backward()
        grads = [(j, p.grad) for j, p in enumerate(params) if p.grad is not None]
        res.grad_sq = grad_sq_fn([g for _, g in grads])
        if not math.isfinite(res.grad_sq):
            raise FloatingPointError(
                f"exact OPOB: trajectory {i} has a non-finite gradient (‖g‖² = {res.grad_sq})"
            )
        coef = math.exp(res.log_wt) / float(std)
        r_centred = float(rewards[k] - mean)
        gs = [g for _, g in grads]  # multi-tensor adds: a few kernels per trajectory, not two per parameter
        torch._foreach_add_([acc[j] for j, _ in grads], gs, alpha=coef * r_centred)
        torch._foreach_add_([score[j] for j, _ in grads], gs, alpha=coef)
    for p in params:
        p.grad = None

    n = len(members)
    if not live:
        zeros = torch.zeros(n, dtype=torch.float64)
        return zeros, mean.cpu().expand(n).clone(), results
    s_t = torch.tensor([r.s for r in results], dtype=torch.float64)
    log_wt_t = torch.tensor([r.log_wt for r in results], dtype=torch.float64)
    tok_t = torch.tensor([r.tokens for r in results], dtype=torch.float64)
    gsq_t = torch.tensor([max(r.grad_sq, 0.0) for r in results], dtype=torch.float64)
    log_w, gsq = opob_weight_inputs(s_t, log_wt_t, tok_t, gsq_t, variant)
    b = opob_baseline(rewards.cpu(), log_w, gsq, torch.zeros(n, dtype=torch.long))
    shift = float(b[0] - mean)
    torch._foreach_add_(acc, score, alpha=-shift)
    torch._foreach_zero_(score)
    adv = (rewards.cpu() - b) / float(std)
    return adv, b, results


def new_buffers(params: list[nn.Parameter]) -> tuple[list[Tensor], list[Tensor]]:
    return [_buffer(p) for p in params], [_buffer(p) for p in params]
