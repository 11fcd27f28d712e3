"""Gradient reductions of a model-parallel shard: what makes per-trajectory norms and the update exact.

After each backward on one rank of a TP x CP model-parallel group:
- sequence-parallel norm weights hold a partial sum over this rank's slice of the sequence:
  sum them over TP (megatron's `finalize_model_grads` does the same for `sequence_parallel` params);
- under CP every rank back-propagated the same loss into its own chunk of the sequence, via a
  differentiable all-gather that multiplies by cp: average over CP.
Then every TP rank holds either a slice of a parameter (`tensor_model_parallel`) or an identical
copy, so the full-model ‖g‖² sums slices over TP and counts copies once (TP rank 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class ShardGroups:
    """Process groups of this rank (None when that dimension has size 1)."""

    tp: dist.ProcessGroup | None
    cp: dist.ProcessGroup | None
    dp: dist.ProcessGroup | None
    tp_rank: int = 0


def _flat_all_reduce(grads: list[Tensor], group: dist.ProcessGroup, op) -> None:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=op, group=group)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(synced)


def finish_backward(params: list[nn.Parameter], groups: ShardGroups) -> None:
    """Make this rank's .grad the gradient of the full model for its shard (SP sum over TP, CP average)."""
    if groups.tp is not None:
        sp = [p.grad for p in params if p.grad is not None and getattr(p, "sequence_parallel", False)]
        _flat_all_reduce(sp, groups.tp, dist.ReduceOp.SUM)
    if groups.cp is not None:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        _flat_all_reduce([p.grad for p in params], groups.cp, dist.ReduceOp.AVG)


def counts_once(p: nn.Parameter, tp_rank: int) -> bool:
    """True for TP slices and, for TP-duplicated parameters, only on TP rank 0 (megatron's rule)."""
    return bool(getattr(p, "tensor_model_parallel", False)) or tp_rank == 0


def grad_sq_norm(params: list[nn.Parameter], grads: list[Tensor | None], groups: ShardGroups) -> float:
    """‖g‖² of the whole model (float64), every TP-duplicate counted once, summed over TP."""
    local = torch.zeros((), dtype=torch.float64, device=params[0].device)
    for p, g in zip(params, grads, strict=True):
        if g is not None and counts_once(p, groups.tp_rank):
            local += g.detach().double().pow(2).sum()
    if groups.tp is not None:
        dist.all_reduce(local, group=groups.tp)
    return float(local)


def clip_grads(params: list[nn.Parameter], max_norm: float, groups: ShardGroups) -> float:
    """Scale .grad so the full-model norm is at most max_norm (torch's clip_grad_norm_ rule); return the norm."""
    grads = [p.grad for p in params]
    norm = grad_sq_norm(params, grads, groups) ** 0.5
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        torch._foreach_mul_([g for g in grads if g is not None], coef)
    return norm
