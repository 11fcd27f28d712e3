"""Staleness is checked where finished samples wait, not only while they are in flight (issue 61, item 4).

The learner is held (its step in progress, an event it waits on) while rollout workers finish groups; the
finished groups wait in the buffer. When the learner comes back the version moves past the bound for them
(a rollback publishes one more version in the same loop iteration), and they must not be trained.
"""

from __future__ import annotations

import asyncio

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig
from agent_rl.types import FinishReason


async def _worker(buf: RolloutBuffer, tasks: list[str], finished: asyncio.Queue[str]) -> None:
    """A rollout worker: admits a prompt, samples one turn with the buffer's current version, finishes it."""
    it = iter(tasks)
    while True:
        gid = await buf.admit(lambda: next(it))
        for i, reward in enumerate((0.0, 1.0)):
            t = buf.start(gid, i, [1, 2])
            t.append_sampled([3, 4], [-0.5, -0.5], buf.version)
            t.reward, t.finish_reason = reward, FinishReason.ANSWER
            buf.finish(t)
        await finished.put(gid)


def buf_task(group_id: str) -> str:
    """The worker's task ids follow its admissions: group g<i> is task t<i>."""
    return "t" + group_id[1:]


async def test_groups_that_finish_while_the_learner_is_held_are_not_trained_once_past_the_bound() -> None:
    k = 1
    buf = RolloutBuffer(BufferConfig(max_staleness=k), batch_prompts=1, group_size=2)
    finished: asyncio.Queue[str] = asyncio.Queue()
    worker = asyncio.create_task(_worker(buf, [f"t{i}" for i in range(100)], finished))
    try:
        first = await buf.take(1)  # the learner takes one group at version 0 and is held in its step
        taken = first[0].group_id
        while (gid := await finished.get()) == taken:  # meanwhile another group finishes, at version 0
            pass
        assert buf.stats()["buffer/ready_groups"] == 1 and buf.version == 0
        # the step ends (version 1) and a rollback publishes once more (version 2): the group that waited,
        # sampled at version 0, is now 2 > k versions old
        buf.set_version(1)
        buf.set_version(2)
        assert buf.stats()["buffer/ready_groups"] == 0, "a finished group older than the bound is still ready"
        assert buf.counters.dropped_stale_waiting == 1 and buf.counters.dropped_stale == 1
        assert list(buf.recycled) == [buf_task(gid)]  # its prompt is sampled again
        nxt = await buf.take(1)  # what the learner trains next was sampled within the bound
        assert nxt[0].group_id != gid
        assert all(t.staleness(buf.version) <= k for t in nxt[0].trajectories)
    finally:
        worker.cancel()


def test_a_resumed_buffer_drops_what_waited_past_a_smaller_bound() -> None:
    """A checkpoint taken under k=3 and loaded under k=1: groups that wait past the new bound are dropped at
    load, before any take."""
    old = RolloutBuffer(BufferConfig(max_staleness=3), batch_prompts=1, group_size=1)
    gid = old.try_admit("a")
    assert gid is not None
    t = old.start(gid, 0, [1])
    t.append_sampled([2], [-0.1], 0)
    t.reward, t.finish_reason = 1.0, FinishReason.ANSWER
    old.finish(t)
    old.set_version(2)  # within k=3: still ready
    new = RolloutBuffer(BufferConfig(max_staleness=1), batch_prompts=1, group_size=1)
    new.load_state(old.state())
    assert new.try_take(1) is None
    assert new.counters.dropped_stale_waiting == 1 and list(new.recycled) == ["a"]
