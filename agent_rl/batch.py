"""Whole groups -> tensors for the learner: collation, data-parallel split, version statistics.

A group (the n samples of one prompt) is the unit of everything here: its rewards define
the baseline, so it is never split across data-parallel ranks, and a masked trajectory
(void turn) keeps its row, with loss mask 0, so it still counts in its group's statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agent_rl.types import FlatTrajectory, Group, Trajectory
from vcpo.batch import PolicyBatch


@dataclass(frozen=True)
class LearnerBatch:
    """A rank's share of a step: the vcpo batch plus the per-token policy versions (-1 off the loss)."""

    policy: PolicyBatch
    versions: torch.Tensor  # [B, T] long
    uids: tuple[str, ...] = ()  # trajectory uid of each row (rows may be sorted by length)
    routed_experts: torch.Tensor | None = (
        None  # MoE: [B, T, layers, top_k] int16 engine routing, -1 unrecorded
    )

    @property
    def num_trajectories(self) -> int:
        return int(self.policy.input_ids.shape[0])


def collate(
    groups: Sequence[Group], *, pad_id: int = 0, max_len: int | None = None, sort_by_length: bool = False
) -> LearnerBatch:
    """Right-padded tensors, one row per trajectory, `group_index` numbering the groups in order.

    `sort_by_length` orders rows longest first (group_index still says which prompt each
    row belongs to): micro-batches of neighbouring rows then carry little padding, which
    matters when multi-turn lengths differ several-fold (benchmarks/learner_step.py).
    Trajectories longer than `max_len` are an error (the engine's context bound should have
    stopped them); silently cutting them would train on a sequence nobody sampled.
    """
    if not groups:
        raise ValueError("collate: no groups (a learner step needs at least one group)")
    flats, group_index, rewards, uids, trajs = [], [], [], [], []
    for gi, g in enumerate(groups):
        if not g.trajectories:
            raise ValueError(f"collate: group {g.group_id!r} has no trajectories")
        for t in g.trajectories:
            if t.group_id != g.group_id:
                raise ValueError(
                    f"collate: trajectory {t.uid} has group_id {t.group_id!r} inside group {g.group_id!r}"
                )
            flat = t.flatten()
            if max_len is not None and len(flat.input_ids) > max_len:
                raise ValueError(
                    f"collate: trajectory {t.uid} has {len(flat.input_ids)} tokens > max_len {max_len}"
                )
            flats.append(flat)
            trajs.append(t)
            group_index.append(gi)
            uids.append(t.uid)
        rewards.extend(g.rewards)
    if sort_by_length:
        order = sorted(
            range(len(flats)), key=lambda i: -len(flats[i].input_ids)
        )  # stable: ties keep input order
        flats = [flats[i] for i in order]
        group_index = [group_index[i] for i in order]
        rewards = [rewards[i] for i in order]
        uids = [uids[i] for i in order]
        trajs = [trajs[i] for i in order]
    B, T = len(flats), max(len(f.input_ids) for f in flats)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    behavior = torch.zeros((B, T), dtype=torch.float32)
    versions = torch.full((B, T), -1, dtype=torch.long)
    teacher = _teacher_tensor(flats, uids, B, T)
    for i, f in enumerate(flats):
        n = len(f.input_ids)
        input_ids[i, :n] = torch.tensor(f.input_ids, dtype=torch.long)
        attention_mask[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(f.loss_mask, dtype=torch.float32)
        behavior[i, :n] = torch.tensor(f.behavior_logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(f.versions, dtype=torch.long)
    # Position 0 has no context to be predicted from; vcpo never puts it in the loss.
    loss_mask[:, 0] = 0.0
    policy = PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behavior_logprobs=behavior,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_index=torch.tensor(group_index, dtype=torch.long),
        teacher_logprobs=teacher,
    )
    return LearnerBatch(policy, versions, tuple(uids), _routes_tensor(trajs, T))


def _routes_tensor(trajs: Sequence[Trajectory], width: int) -> torch.Tensor | None:
    """[B, T, layers x top_k] int16 of the trajectories' routed experts (-1 past each record), or None when
    none has one (a dense model, or engines that do not report routing)."""
    first = next((t.routed_experts for t in trajs if t.routed_experts is not None), None)
    if first is None:
        return None
    out = torch.full((len(trajs), width, first.width), -1, dtype=torch.int16)
    for i, t in enumerate(trajs):
        r = t.routed_experts
        if r is None:
            continue
        if r.width != first.width:
            raise ValueError(
                f"collate: trajectory {t.uid} has routed experts of {r.width} ids per position, others {first.width}"
            )
        out[i, : r.positions] = torch.frombuffer(bytearray(r.ids), dtype=torch.int16).view(
            r.positions, r.width
        )
    return out


def _teacher_tensor(flats: list[FlatTrajectory], uids: list[str], b: int, t: int) -> torch.Tensor | None:
    """[B, T] teacher log-probs (on-policy distillation) when the trajectories carry them, else None."""
    scored = [f.teacher_logprobs is not None for f in flats]
    if not any(scored):
        return None
    if not all(scored):
        raise ValueError(
            f"collate: trajectory {uids[scored.index(False)]} has no teacher log-probs but others do"
        )
    out = torch.zeros((b, t), dtype=torch.float32)
    for i, f in enumerate(flats):
        out[i, : len(f.input_ids)] = torch.tensor(f.teacher_logprobs, dtype=torch.float32)
    return out


def split_groups(groups: Sequence[Group], world_size: int) -> list[list[Group]]:
    """Deal whole groups to `world_size` ranks: equal trajectory counts first, then balanced tokens.

    Equal trajectory counts per rank make the mean-over-trajectories loss, averaged across
    ranks, equal to the single-process mean, so dp=N computes the same update as dp=1.
    Order within a rank follows the input order (deterministic).
    """
    if world_size < 1:
        raise ValueError(f"split_groups: world_size must be >= 1, got {world_size}")
    if len(groups) < world_size:
        raise ValueError(
            f"split_groups: {len(groups)} groups cannot feed {world_size} data-parallel ranks; "
            f"use train.batch_prompts >= learner.dp"
        )
    if world_size == 1:
        return [list(groups)]
    sizes = [(len(g.trajectories), sum(len(t) for t in g.trajectories)) for g in groups]
    order = sorted(range(len(groups)), key=lambda i: (-sizes[i][1], i))  # longest first: greedy balance
    load = [[0, 0, 0] for _ in range(world_size)]  # trajectories, tokens, groups
    assigned: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        r = min(range(world_size), key=lambda r: (load[r][0], load[r][2], load[r][1], r))
        assigned[r].append(i)
        load[r][0] += sizes[i][0]
        load[r][1] += sizes[i][1]
        load[r][2] += 1
    return [[groups[i] for i in sorted(idx)] for idx in assigned]


def version_stats(groups: Sequence[Group], learner_version: int) -> dict[str, float]:
    """Learner-side staleness of a batch, from the versions of its sampled tokens.

    staleness = learner version - oldest sampled version of a trajectory; a *partial*
    rollout is one whose sampled tokens span more than one version (a weight update
    interrupted it and it was continued).
    """
    lo, hi, stale, partial = [], [], [], 0
    for g in groups:
        for t in g.trajectories:
            mn, mx = t.min_version, t.max_version
            if mn is None or mx is None:
                continue
            lo.append(mn)
            hi.append(mx)
            stale.append(learner_version - mn)
            partial += mx > mn
    if not stale:
        return {"learner/sampled_trajectories": 0.0}
    stale_t = torch.tensor(stale, dtype=torch.float64)
    out = {
        "learner/batch_min_version": float(min(lo)),
        "learner/batch_max_version": float(max(hi)),
        "learner/staleness_mean": float(stale_t.mean()),
        "learner/staleness_max": float(stale_t.max()),
        "learner/staleness_p50": float(stale_t.quantile(0.5)),
        "learner/staleness_p90": float(stale_t.quantile(0.9)),
        "learner/partial_rollout_ratio": partial / len(stale),
        "learner/sampled_trajectories": float(len(stale)),
    }
    for k, count in zip(*torch.unique(stale_t.long(), return_counts=True), strict=True):
        out[f"learner/staleness_hist/{int(k)}"] = float(count) / len(stale)
    return out
