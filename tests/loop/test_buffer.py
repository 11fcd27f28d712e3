"""Partial-rollout buffer invariants over random interleavings (hypothesis) plus hand-built cases."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent_rl.buffer import BufferClosed, BufferStalled, RolloutBuffer
from agent_rl.config import BufferConfig
from agent_rl.types import FinishReason, Trajectory

N = 3  # group size
B = 2  # batch prompts


def _sample(traj: Trajectory, version: int, n: int = 2) -> None:
    traj.append_sampled([1] * n, [-0.5] * n, version)


def _finish(traj: Trajectory, reward: float, reason: FinishReason = FinishReason.ANSWER) -> None:
    traj.reward, traj.finish_reason = reward, reason


class BufferMachine(RuleBasedStateMachine):
    """submit / sample (across versions) / finish / abort-abandon / version bump / take, in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 1
        self.buf = RolloutBuffer(
            BufferConfig(max_staleness=self.k, drop_uniform_groups=True), batch_prompts=B, group_size=N
        )
        self.tasks = 0
        self.running: list[Trajectory] = []
        self.delivered: set[str] = set()
        self.delivered_uids: set[str] = set()
        self.opened: set[str] = set()

    @rule()
    def submit(self) -> None:
        gid = self.buf.try_admit(f"t{self.tasks}")
        self.tasks += 1
        if gid is not None:
            self.opened.add(gid)

    @rule(data=st.data())
    def start_member(self, data: st.DataObject) -> None:
        free = [(g.group_id, i) for g in self.buf.open_groups() for i, m in enumerate(g.members) if m is None]
        if free:
            gid, i = data.draw(st.sampled_from(free))
            self.running.append(self.buf.start(gid, i, [7, 8]))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def sample_turn(self, data: st.DataObject) -> None:
        """A turn (or a continuation after an abort) sampled by the current version."""
        _sample(data.draw(st.sampled_from(self.running)), self.buf.version)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), reward=st.sampled_from([0.0, 1.0]), error=st.booleans())
    def finish_member(self, data: st.DataObject, reward: float, error: bool) -> None:
        t = data.draw(st.sampled_from(self.running))
        self.running.remove(t)
        if self.buf.doomed(t.group_id) and data.draw(st.booleans()):
            self.buf.abandon(t)
            return
        _finish(t, reward, FinishReason.ERROR if error and data.draw(st.booleans()) else FinishReason.ANSWER)
        self.buf.finish(t)

    @rule()
    def bump_version(self) -> None:
        self.buf.set_version(self.buf.version + 1)

    @rule(n=st.integers(1, 3))
    def take(self, n: int) -> None:
        batch = self.buf.try_take(n)
        if batch is None:
            return
        assert len(batch) == n
        for g in batch:
            assert g.group_id not in self.delivered, "group delivered twice"
            self.delivered.add(g.group_id)
            # whole: every member sampled is there, the infrastructure's failures left out of the group's
            # baseline (Group.left_out), never delivered as members
            assert g.size == N, "group not whole"
            assert g.trajectories and all(t.infra_failed for t in g.left_out)
            for t in g.trajectories:
                assert t.done and not t.infra_failed
                assert t.staleness(self.buf.version) <= self.k, "delivered over the staleness bound"
                assert t.uid not in self.delivered_uids
                self.delivered_uids.add(t.uid)
            assert len({t.reward for t in g.trajectories}) > 1, "uniform group delivered"

    @rule()
    def checkpoint_roundtrip(self) -> None:
        state = self.buf.state()
        other = RolloutBuffer(self.buf.cfg, batch_prompts=B, group_size=N)
        other.load_state(state)
        assert other.state() == state

    @invariant()
    def every_group_ends_exactly_once(self) -> None:
        c = self.buf.counters
        dropped = c.dropped_stale + c.dropped_uniform + c.dropped_error
        live_open = len(self.buf.open_groups())
        ready = self.buf.stats()["buffer/ready_groups"]
        assert c.admitted == len(self.opened)
        assert c.delivered_groups == len(self.delivered)
        # admitted = delivered + dropped + open + ready: nothing both delivered and dropped, nothing lost
        assert c.admitted == c.delivered_groups + dropped + live_open + ready
        assert c.recycled == c.dropped_stale + c.dropped_error == len(self.buf.recycled)

    @invariant()
    def admission_within_bound(self) -> None:
        pending = len(self.buf.open_groups()) + self.buf.stats()["buffer/ready_groups"]
        assert pending <= (self.k + 1) * B


TestBufferInterleavings = BufferMachine.TestCase
TestBufferInterleavings.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _full_group(buf: RolloutBuffer, task: str, rewards: list[float], version: int) -> str:
    gid = buf.try_admit(task)
    assert gid is not None
    for i, r in enumerate(rewards):
        t = buf.start(gid, i, [1])
        _sample(t, version)
        _finish(t, r)
        buf.finish(t)
    return gid


def test_group_past_bound_is_dropped_and_its_prompt_recycled() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=1), batch_prompts=1, group_size=2)
    _full_group(buf, "a", [0.0, 1.0], version=0)
    buf.set_version(1)
    assert buf.try_take(1) is not None  # staleness 1 == k: still deliverable
    buf2 = RolloutBuffer(BufferConfig(max_staleness=1), batch_prompts=1, group_size=2)
    _full_group(buf2, "a", [0.0, 1.0], version=0)
    buf2.set_version(2)
    assert buf2.try_take(1) is None
    assert buf2.counters.dropped_stale == 1 and list(buf2.recycled) == ["a"]


def test_admission_at_k0_allows_one_batch_per_learner_step() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=2, group_size=1)
    _full_group(buf, "a", [1.0], version=0)
    _full_group(buf, "b", [0.0], version=0)
    assert buf.try_admit("c") is None
    assert buf.try_take(2) is not None
    assert buf.try_admit("c") is None, "sampled with the old weights during the step: stale at k=0"
    buf.set_version(1)
    assert buf.try_admit("c") is not None


def test_a_skipped_learner_step_does_not_close_admission() -> None:
    """Regression: admission counted versions, so steps the learner skipped (every trajectory masked:
    version unchanged) used up the budget until no prompt could start and the learner waited forever."""
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=1)
    for step in range(3):  # three batches taken, none of them moved the version
        _full_group(buf, f"t{step}", [1.0], version=0)
        assert buf.try_take(1) is not None
        buf.set_version(0)
    assert buf.try_admit("next") is not None


async def test_take_sees_a_group_that_completes_right_after_it_starts_waiting() -> None:
    """Regression: take() waited via wait_for(self._wait()), whose task reads the wake event one loop
    turn late; a batch completed in that turn was never noticed and the run hung (level b, k=8)."""
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=1)
    gid = buf.try_admit("a")
    assert gid is not None
    waiter = asyncio.create_task(buf.take(1))
    await asyncio.sleep(0)  # take() runs: nothing ready, it starts waiting
    t = buf.start(gid, 0, [1])
    _sample(t, 0)
    _finish(t, 1.0)
    buf.finish(t)  # the last report, in the same loop turn
    (g,) = await asyncio.wait_for(waiter, 600)
    assert g.group_id == gid


async def test_take_fails_with_the_buffer_state_when_nothing_finishes() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0, stall_timeout_s=0.05), batch_prompts=1, group_size=2)
    gid = buf.try_admit("a")
    assert gid is not None
    buf.start(gid, 0, [1])  # an episode that never finishes (a hung engine)
    with pytest.raises(BufferStalled, match=r"stall_timeout_s=0.05 .* 0 ready, 1 in flight"):
        await buf.take(1)


def test_void_trajectory_is_masked_but_keeps_its_reward_in_the_group() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0, mask_void=True), batch_prompts=1, group_size=2)
    gid = buf.try_admit("a")
    assert gid is not None
    t0, t1 = buf.start(gid, 0, [1]), buf.start(gid, 1, [1])
    _sample(t0, 0)
    _sample(t1, 0)
    _finish(t0, 0.0, FinishReason.VOID)
    _finish(t1, 1.0)
    buf.finish(t0)
    buf.finish(t1)
    (g,) = buf.try_take(1) or []
    assert g.trajectories[0].masked and not g.trajectories[1].masked
    assert g.rewards == [0.0, 1.0]
    assert set(g.trajectories[0].flatten().loss_mask) == {0}


def test_in_flight_partial_trajectories_survive_a_checkpoint_with_their_versions() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=2), batch_prompts=1, group_size=2)
    gid = buf.try_admit("a")
    assert gid is not None
    t = buf.start(gid, 0, [5, 6])
    _sample(t, 0, 3)
    buf.set_version(1)
    _sample(t, 1, 2)  # continuation after the weight update
    other = RolloutBuffer(buf.cfg, batch_prompts=1, group_size=2)
    other.load_state(buf.state())
    (g,) = other.open_groups()
    restored = g.members[0]
    assert restored is not None and g.members[1] is None
    assert restored.flatten().versions == [-1, -1, 0, 0, 0, 1, 1]


async def test_take_waits_for_a_whole_group_and_raises_when_rollouts_fail() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=2)
    waiter = asyncio.create_task(buf.take(1))
    await asyncio.sleep(0)
    gid = buf.try_admit("a")
    assert gid is not None
    t0 = buf.start(gid, 0, [1])
    _sample(t0, 0)
    _finish(t0, 1.0)
    buf.finish(t0)
    await asyncio.sleep(0)
    assert not waiter.done(), "delivered half a group"
    t1 = buf.start(gid, 1, [1])
    _sample(t1, 0)
    _finish(t1, 0.0)
    buf.finish(t1)
    (g,) = await asyncio.wait_for(waiter, 600)
    assert len(g.trajectories) == 2
    buf.fail(RuntimeError("engine gone"))
    with pytest.raises(BufferClosed, match="engine gone"):
        await buf.take(1)
