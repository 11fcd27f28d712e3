"""Trajectory invariants, flattening and the versioned binary serialisation."""

from __future__ import annotations

import math

import pytest

from agent_rl.types import FinishReason, Segment, Trajectory, TrajectoryError, TurnInfo


def _traj() -> Trajectory:
    t = Trajectory(uid="u1", group_id="g1", prompt_ids=[5, 6, 7], task_id="row-3")
    t.append_sampled([10, 11], [-0.5, -1.25], versions=3)
    t.append_env([20, 21, 22])
    t.append_sampled([12], [-0.125], versions=[4])
    t.reward, t.finish_reason = 1.0, FinishReason.ANSWER
    t.turns.append(TurnInfo(sampled_tokens=3, env_tokens=3, code_ran=True, exit_code=0, tool_seconds=0.01))
    t.extras["note"] = 2.0
    return t


def test_flatten_puts_loss_mask_only_on_sampled_tokens():
    flat = _traj().flatten()
    assert flat.input_ids == [5, 6, 7, 10, 11, 20, 21, 22, 12]
    assert flat.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert flat.behavior_logprobs == [0, 0, 0, -0.5, -1.25, 0, 0, 0, -0.125]
    assert flat.versions == [-1, -1, -1, 3, 3, -1, -1, -1, 4]


def test_masked_trajectory_flattens_to_all_zero_loss_mask():
    t = _traj()
    t.masked = True
    assert sum(t.flatten().loss_mask) == 0


def test_min_and_max_version_and_staleness_use_the_oldest_sampled_token():
    t = _traj()
    assert (t.min_version, t.max_version) == (3, 4)
    assert t.staleness(learner_version=6) == 3


def test_roundtrip_preserves_every_field_exactly():
    t = _traj()
    back = Trajectory.from_bytes(t.to_bytes())
    assert back == t


def test_serialisation_is_compact():
    t = Trajectory(uid="u", group_id="g", prompt_ids=list(range(1000)))
    t.append_sampled(list(range(2000)), [-0.1] * 2000, versions=1)
    assert len(t.to_bytes()) < 2000 * 8  # well under a JSON encoding of the same lists


def test_from_bytes_rejects_unknown_format_version():
    data = bytearray(_traj().to_bytes())
    data[4:6] = (99).to_bytes(2, "little")
    with pytest.raises(TrajectoryError, match="format version 99"):
        Trajectory.from_bytes(bytes(data))


def test_append_rejects_mismatched_lengths_with_both_counts():
    t = Trajectory(uid="u7", group_id="g", prompt_ids=[1])
    with pytest.raises(TrajectoryError, match=r"u7 segment 0: 3 token ids but 2 logprobs and 3 versions"):
        t.append_sampled([1, 2, 3], [-0.1, -0.2], versions=0)


def test_append_rejects_nan_logprob_naming_the_token():
    t = Trajectory(uid="u8", group_id="g", prompt_ids=[1])
    with pytest.raises(TrajectoryError, match=r"token 1 \(id 42\) has log-prob nan"):
        t.append_sampled([41, 42], [-0.1, math.nan], versions=0)


def test_validate_rejects_non_finite_reward():
    t = _traj()
    t.reward = math.inf
    with pytest.raises(TrajectoryError, match="reward is inf"):
        t.validate()


def test_env_segment_with_versions_is_rejected():
    with pytest.raises(TrajectoryError, match="env segment carries versions"):
        Segment((1, 2), None, (0, 0)).check("here")


def test_aborted_trajectory_is_not_done():
    t = _traj()
    t.finish_reason = FinishReason.ABORT
    assert not t.done
