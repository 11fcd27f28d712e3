"""Collation of whole groups into vcpo batches, and the data-parallel split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learner_helpers import make_groups

from agent_rl.batch import collate, split_groups, version_stats
from agent_rl.types import Group, Trajectory


def test_collate_pads_right_and_copies_flattened_views(tiny_model_dir: Path) -> None:
    groups = make_groups(tiny_model_dir, n_groups=3, n=2)
    lb = collate(groups, pad_id=0)
    b = lb.policy
    b.validate()
    flats = [t.flatten() for g in groups for t in g.trajectories]
    T = max(len(f.input_ids) for f in flats)
    assert b.input_ids.shape == (6, T) and lb.versions.shape == (6, T)
    for i, f in enumerate(flats):
        n = len(f.input_ids)
        assert b.input_ids[i, :n].tolist() == f.input_ids
        assert b.attention_mask[i].tolist() == [1] * n + [0] * (T - n)
        assert b.loss_mask[i, :n].tolist() == [float(m) for m in f.loss_mask]
        assert b.loss_mask[i, n:].sum() == 0
        assert torch.allclose(b.behavior_logprobs[i, :n], torch.tensor(f.behavior_logprobs))
        assert lb.versions[i, :n].tolist() == f.versions
    assert b.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert b.rewards.tolist() == [t.reward for g in groups for t in g.trajectories]


def test_masked_trajectory_keeps_its_row_and_reward_but_no_loss(tiny_model_dir: Path) -> None:
    groups = make_groups(tiny_model_dir, n_groups=1, n=3)
    groups[0].trajectories[1].masked = True
    groups[0].trajectories[1].reward = 1.0
    b = collate(groups).policy
    assert b.input_ids.shape[0] == 3
    assert b.loss_mask[1].sum() == 0 and b.loss_mask[0].sum() > 0
    assert b.rewards[1] == 1.0 and b.group_index.tolist() == [0, 0, 0]


def test_trajectory_without_reward_counts_as_zero_and_mixed_groups_are_refused() -> None:
    t = Trajectory(uid="a", group_id="g", prompt_ids=[5, 6])
    t.append_sampled([7, 8], [-1.0, -2.0], 3)
    assert collate([Group("g", [t])]).policy.rewards.tolist() == [0.0]
    with pytest.raises(ValueError, match="group_id 'g' inside group 'h'"):
        collate([Group("h", [t])])
    with pytest.raises(ValueError, match="no groups"):
        collate([])


@pytest.mark.parametrize(("n_groups", "world"), [(4, 2), (5, 2), (7, 3), (3, 3)])
def test_split_keeps_groups_whole_and_balances_trajectories(
    tiny_model_dir: Path, n_groups: int, world: int
) -> None:
    groups = make_groups(tiny_model_dir, n_groups=n_groups, n=2, seed=n_groups)
    shards = split_groups(groups, world)
    assert len(shards) == world and all(shards)
    ids = sorted(g.group_id for s in shards for g in s)
    assert ids == sorted(g.group_id for g in groups)  # each group exactly once, whole
    counts = [sum(len(g.trajectories) for g in s) for s in shards]
    assert max(counts) - min(counts) <= 2  # at most one group apart
    for s in shards:
        b = collate(s).policy
        assert b.group_index.max() == len(s) - 1


def test_split_refuses_fewer_groups_than_ranks(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="batch_prompts >= learner.dp"):
        split_groups(make_groups(tiny_model_dir, n_groups=1), 2)


def test_version_stats_measure_staleness_and_partial_rollouts() -> None:
    a = Trajectory(uid="a", group_id="g", prompt_ids=[1])
    a.append_sampled([2, 3], [-1.0, -1.0], 4)
    a.append_sampled([4], [-1.0], 5)  # continued after a weight update: partial
    b = Trajectory(uid="b", group_id="g", prompt_ids=[1])
    b.append_sampled([2], [-1.0], 6)
    s = version_stats([Group("g", [a, b])], learner_version=6)
    assert s["learner/batch_min_version"] == 4 and s["learner/batch_max_version"] == 6
    assert s["learner/staleness_mean"] == 1.0 and s["learner/staleness_max"] == 2.0
    assert s["learner/partial_rollout_ratio"] == 0.5
    assert s["learner/staleness_hist/0"] == 0.5 and s["learner/staleness_hist/2"] == 0.5


def test_length_sort_keeps_rows_aligned_with_their_group_and_reward(tiny_model_dir: Path) -> None:
    groups = make_groups(tiny_model_dir, n_groups=3, n=3, seed=5)
    plain, srt = collate(groups).policy, collate(groups, sort_by_length=True).policy
    lengths = srt.attention_mask.sum(-1).tolist()
    assert lengths == sorted(lengths, reverse=True)

    def rows(b):
        return sorted(
            (
                tuple(b.input_ids[i].tolist()),
                int(b.group_index[i]),
                float(b.rewards[i]),
                tuple(b.loss_mask[i].tolist()),
            )
            for i in range(b.size)
        )

    assert rows(plain) == rows(srt)
