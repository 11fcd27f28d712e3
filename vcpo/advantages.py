"""Group-relative advantages from outcome rewards: GRPO (mean/std) and RLOO (leave-one-out).

A prompt group is the n samples of one prompt (``group_ids`` equal). Every function returns
per-trajectory tensors ([B]) so callers never loop over groups in Python. The OPOB baseline,
which also needs gradient norms and IS weights, lives in baseline.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ADVANTAGES = ("grpo", "rloo", "opob")
STD_EPS = 1e-6  # a group whose reward std is at most this has advantage 0 (nothing to learn)


@dataclass(frozen=True)
class GroupStats:
    """Per-trajectory view of its group's reward statistics (all [B], float64)."""

    index: Tensor  # [B] dense group index 0..G-1
    count: Tensor  # size of the trajectory's group
    mean: Tensor  # group mean reward
    std: Tensor  # group reward std (population, as in the reference)


def dense_groups(group_ids: Tensor, num_groups: int | None = None) -> tuple[Tensor, int]:
    """(each trajectory's group numbered 0..G-1 in order of id, G). `num_groups`: the ids are already that (on a
    GPU, numbering them reads the device and waits for it)."""
    if num_groups is not None:
        return group_ids, num_groups
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_stats(rewards: Tensor, group_ids: Tensor, *, num_groups: int | None = None) -> GroupStats:
    """`num_groups`: the ids are already 0..num_groups-1 (`dense_groups`)."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [B]"
        )
    r = rewards.detach().double()
    index, n_groups = dense_groups(group_ids, num_groups)
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, index, torch.ones_like(r))
    mean = zeros.index_add(0, index, r) / count
    var = zeros.index_add(0, index, (r - mean[index]) ** 2) / count
    return GroupStats(index=index, count=count[index], mean=mean[index], std=var.sqrt()[index])


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, *, num_groups: int | None = None
) -> tuple[Tensor, Tensor]:
    """(advantage, baseline): A = (R − mean_g) / std_g; 0 for constant-reward or singleton groups."""
    g = group_stats(rewards, group_ids, num_groups=num_groups)
    live = g.std > STD_EPS
    adv = torch.where(live, (rewards.double() - g.mean) / g.std.clamp(min=STD_EPS), 0.0)
    return adv, g.mean


def rloo_advantages(
    rewards: Tensor, group_ids: Tensor, *, num_groups: int | None = None
) -> tuple[Tensor, Tensor]:
    """(advantage, baseline): A = R − mean of the other members; 0 for singleton groups."""
    g = group_stats(rewards, group_ids, num_groups=num_groups)
    r = rewards.double()
    total = g.mean * g.count
    others = torch.where(g.count > 1, (total - r) / (g.count - 1).clamp(min=1), r)
    return r - others, others
