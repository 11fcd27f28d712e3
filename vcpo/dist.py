"""The few collectives one step needs, each a no-op without a process group."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def all_reduce(t: Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None) -> Tensor:
    if group is not None:
        dist.all_reduce(t, op=op, group=group)
    return t


def sync_grads(params: Sequence[nn.Parameter], group: dist.ProcessGroup | None, scale: float) -> None:
    """Sum every parameter's gradient over ``group`` in ONE collective, then multiply by scale.

    Missing gradients become zeros first, so every rank reduces the same flat layout even
    when a rank's trajectories never touched some parameter.
    """
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    if group is not None and dist.get_world_size(group) > 1:
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(synced)
    if scale != 1.0:
        torch._foreach_mul_(grads, scale)
