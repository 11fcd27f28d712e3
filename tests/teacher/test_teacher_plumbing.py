"""Teacher scores on their way to the learner: the trajectory (and its serialisation), the learner batch, the
scorer's fallbacks (a checkpointed trajectory never sent, a teacher that is gone), the trajectory log."""

from __future__ import annotations

import math

import pytest
import torch
from teacher_testlib import fp32_tolerance

from agent_rl.batch import collate
from agent_rl.engines.api import EngineOptions
from agent_rl.engines.client import SGLangClient
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.launch import free_port
from agent_rl.teacher.scorer import TeacherError, TeacherScorer
from agent_rl.types import FinishReason, Group, Trajectory, TrajectoryError
from agent_rl.viewer.log import StepSummary, decode_step, encode_step
from agent_rl.viewer.report import step_json


def _traj(uid: str = "g0/0", teacher: bool = True) -> Trajectory:
    t = Trajectory(uid=uid, group_id=uid.split("/")[0], prompt_ids=[5, 6, 7])
    t.append_sampled([8, 9], [-0.5, -1.0], 0)
    t.append_env([10, 11, 12])  # a tool observation: context, never a target
    t.append_sampled([13], [-0.25], 1)
    t.reward, t.finish_reason = 1.0, FinishReason.ANSWER
    if teacher:
        t.set_teacher_logprobs([-0.4, -2.0, -0.3])
    return t


def test_teacher_logprobs_sit_on_the_sampled_positions_and_survive_serialisation():
    t = _traj()
    flat = t.flatten()
    assert flat.teacher_logprobs == [0.0, 0.0, 0.0, -0.4, -2.0, 0.0, 0.0, 0.0, -0.3]
    back = Trajectory.from_bytes(t.to_bytes())
    assert back.teacher_logprobs == [-0.4, -2.0, -0.3] and back.flatten() == flat
    assert Trajectory.from_bytes(_traj(teacher=False).to_bytes()).teacher_logprobs is None


@pytest.mark.parametrize(
    ("values", "match"), [([-0.4, -2.0], "2 teacher log-probs for 3"), ([-0.4, math.nan, -1.0], "nan")]
)
def test_bad_teacher_logprobs_are_refused_naming_the_trajectory(values, match):
    with pytest.raises(TrajectoryError, match=match):
        _traj(teacher=False).set_teacher_logprobs(values)


def test_the_learner_batch_carries_teacher_logprobs_and_refuses_a_batch_scored_only_in_part():
    batch = collate([Group("g0", [_traj("g0/0"), _traj("g0/1")])])
    tlp = batch.policy.teacher_logprobs
    assert tlp is not None and tlp[0].tolist() == pytest.approx([0, 0, 0, -0.4, -2.0, 0, 0, 0, -0.3])
    batch.policy.validate()
    assert collate([Group("g0", [_traj("g0/0", teacher=False)])]).policy.teacher_logprobs is None
    with pytest.raises(ValueError, match="g0/1 has no teacher log-probs"):
        collate([Group("g0", [_traj("g0/0"), _traj("g0/1", teacher=False)])])


async def test_a_trajectory_restored_without_scores_is_scored_when_the_learner_takes_it(
    tiny_model_dir, reference_logprobs
):
    engine = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=2, max_seq_len=64))
    scorer = TeacherScorer([engine])
    try:
        t = _traj(teacher=False)  # e.g. from a checkpoint: never went through finish()
        await scorer.ensure([Group("g0", [t])])
        ids = t.prompt_ids + t.response_ids
        ref32, ref64 = reference_logprobs(ids, 1)
        at = torch.tensor([3, 4, 8]) - 1  # the sampled positions
        diff = float((torch.tensor(t.teacher_logprobs, dtype=torch.float64) - ref64[at]).abs().max())
        assert diff <= fp32_tolerance(ref32[at], ref64[at])
        assert scorer.stats()["teacher/scored_tokens"] == 3
    finally:
        await scorer.close()
        await engine.close()


async def test_a_teacher_that_is_gone_fails_the_take_after_bounded_retries():
    client = SGLangClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    scorer = TeacherScorer([client], max_retries=1)
    t = _traj(teacher=False)
    scorer.schedule([t])
    try:
        with pytest.raises(TeacherError, match="failed 2 times"):
            await scorer.ensure([Group("g0", [t])])
        assert scorer.retries == 1
    finally:
        await scorer.close()
        await client.close()


def test_the_trajectory_log_records_teacher_logprobs_for_the_viewer(tmp_path):
    groups = [Group("g0", [_traj("g0/0"), _traj("g0/1", teacher=False)])]
    blob, _ = encode_step(groups, {})
    summary = StepSummary(0, 0, len(blob), 2, 1, 2, 0, 1.0, None, None, None, 0)
    rec = decode_step(summary, blob)
    scored, unscored = rec.trajectories
    assert [len(s.teacher_logprobs) for s in scored.segments] == [2, 0, 1]
    recorded = [x for s in scored.segments for x in s.teacher_logprobs]
    assert recorded == pytest.approx([-0.4, -2.0, -0.3], rel=2**-23)  # stored as float32
    assert all(s.teacher_logprobs == [] for s in unscored.segments)
    page = step_json(rec, lambda ids: " ".join(map(str, ids)))
    blocks = page["groups"][0]["trajectories"][0]["blocks"]  # type: ignore[index]
    assert [b["t"] for b in blocks] == [[-0.4, -2.0], None, [-0.3]]


async def test_a_finished_episode_and_its_forks_go_to_the_teacher_before_the_learner_asks(tiny_model_dir):
    from agent_rl.config import BufferConfig
    from agent_rl.teacher import TeacherBuffer

    engine = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=2, max_seq_len=64))
    scorer = TeacherScorer([engine])
    buffer = TeacherBuffer(scorer, BufferConfig(max_staleness=0), batch_prompts=1, group_size=2)
    try:
        gid = buffer.try_admit("task-0")
        assert gid is not None
        members = [buffer.start(gid, i, [5, 6, 7]) for i in range(2)]
        fork = buffer.fork(members[0], 1)  # an agent episode that split: a second trajectory of member 0
        for t in (*members, fork):
            t.append_sampled([8, 9], [-0.5, -1.0], 0)
            t.reward, t.finish_reason = 1.0, FinishReason.ANSWER
        buffer.finish(members[0])
        assert (
            scorer.stats()["teacher/in_flight"] == 2
        )  # the member and its fork, sent the moment it finished
        buffer.finish(members[1])
        (group,) = await buffer.take(1)
        assert len(group.trajectories) == 3 and all(
            len(t.teacher_logprobs or []) == 2 for t in group.trajectories
        )
    finally:
        await scorer.close()
        await engine.close()
