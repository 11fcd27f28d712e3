"""The routing record a trajectory keeps (types.RoutedExperts), its wire form and its learner tensor."""

from __future__ import annotations

import base64
from array import array

import pytest
import torch

from agent_rl.batch import collate
from agent_rl.engines import routed_experts
from agent_rl.engines.api import EngineError
from agent_rl.types import Group, RoutedExperts, Trajectory, TrajectoryError


def routes(rows: int, width: int = 4, start: int = 0) -> RoutedExperts:
    return RoutedExperts.from_ints(range(start, start + rows * width), width)


def trajectory(uid: str = "t0", group: str = "g") -> Trajectory:
    t = Trajectory(uid=uid, group_id=group, prompt_ids=[1, 2, 3], reward=1.0)
    t.append_sampled([4, 5], [-0.1, -0.2], 0)
    t.append_env([6])
    t.append_sampled([7], [-0.3], 0)
    return t  # 7 tokens


def test_each_position_keeps_the_routing_of_the_call_that_first_fed_it():
    """A later call (the next turn) adds only the positions past the record; the earlier ones keep the routing
    their own turn used (issue 61). A shorter or missing record changes nothing."""
    t = trajectory()
    t.set_routed_experts(routes(4))
    t.set_routed_experts(routes(6, start=100))  # the next turn's call: re-routes 0..3, adds 4 and 5
    assert t.routed_experts.positions == 6
    assert list(t.routed_experts.ids) == list(range(16)) + list(range(116, 124))
    t.set_routed_experts(routes(3))
    t.set_routed_experts(None)  # an engine that reports none
    assert t.routed_experts.positions == 6 and t.routed_experts.ids[0] == 0


def test_a_record_longer_than_the_trajectory_or_of_another_width_is_refused():
    t = trajectory()
    with pytest.raises(TrajectoryError, match="routed experts for 8 positions, but it has 7 tokens"):
        t.set_routed_experts(routes(8))
    t.set_routed_experts(routes(2))
    with pytest.raises(TrajectoryError, match="6 ids per position after 4: .* different models"):
        t.set_routed_experts(routes(3, width=6))
    with pytest.raises(TrajectoryError, match="does not fit int16"):
        RoutedExperts.from_ints([40000], 1)


def test_serialised_trajectories_keep_their_routing():
    t = trajectory()
    t.set_routed_experts(routes(6))
    back = Trajectory.from_bytes(t.to_bytes())
    assert back.routed_experts == t.routed_experts
    assert Trajectory.from_bytes(trajectory().to_bytes()).routed_experts is None


def test_collate_aligns_routing_with_the_rows_and_pads_with_minus_one():
    long, short = trajectory("a"), Trajectory(uid="b", group_id="g", prompt_ids=[1, 2], reward=0.0)
    short.append_sampled([9], [-0.5], 0)
    long.set_routed_experts(routes(6))
    short.set_routed_experts(routes(2, start=500))
    batch = collate([Group("g", [short, long])], sort_by_length=True)  # long first
    ids = batch.routed_experts
    assert ids is not None and ids.shape == (2, 7, 4) and ids.dtype == torch.int16
    assert batch.uids == ("a", "b")
    assert ids[0, :6].flatten().tolist() == list(range(24)) and bool((ids[0, 6] == -1).all())
    assert ids[1, :2].flatten().tolist() == list(range(500, 508)) and bool((ids[1, 2:] == -1).all())
    assert collate([Group("g", [trajectory()])]).routed_experts is None


def test_wire_form_round_trips_and_reads_narrower_sglang_dtypes():
    r = routes(5)
    meta = {"prompt_tokens": 4, "completion_tokens": 2} | routed_experts.to_meta(r)
    assert routed_experts.from_meta(meta, "x") == r
    narrow = {
        "prompt_tokens": 2, "completion_tokens": 2, "routed_experts_dtype": "uint8",
        "routed_experts": base64.b64encode(array("B", range(9)).tobytes()).decode(),
    }  # fmt: skip
    assert routed_experts.from_meta(narrow, "x") == RoutedExperts.from_ints(range(9), 3)
    assert routed_experts.from_meta({"prompt_tokens": 3}, "x") is None
    with pytest.raises(EngineError, match="request x: 10 routed expert ids are not 3 whole rows"):
        routed_experts.from_meta(
            {"prompt_tokens": 3, "completion_tokens": 1} | routed_experts.to_meta(routes(5, width=2)), "x"
        )
