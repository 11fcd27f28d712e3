"""`buffer.wait_for_due` as properties of the real RolloutBuffer driven by a simulated run (hypothesis).

A tick-by-tick simulation plays the rollout workers and the learner against the real buffer: groups are
admitted whenever admission allows, each member samples one token per tick at the current version for as
many ticks as its (drawn, long-tailed) episode length, members of a doomed group stop and are abandoned (as
the real workers do), and the learner takes `B` groups whenever `try_take` gives them, trains for a drawn
number of ticks, then moves the version on. Over random episode lengths, learner speeds, k and B:

1. a due group is taken before a fresher one: no batch holds a non-due group while a ready due group is
   left behind, and the learner never steps while a due group is still in flight;
2. nothing sampled is dropped: no group goes stale, no sampled token is thrown away;
3. the length distribution trained equals the one sampled: the episode lengths of the trained groups (plus
   those ready at the end) are exactly those of every group whose sampling ended (finished or stopped).

These FAIL with the feature disabled (`BufferConfig(wait_for_due=False)`: the learner steps past long
episodes, they go over the bound and are dropped, so the trained lengths are shorter than the sampled ones);
`test_the_properties_fail_without_wait_for_due` runs the same simulation with it off and checks that the
properties are violated, so this file cannot pass with a buffer that ignores the flag.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig
from agent_rl.types import FinishReason, Trajectory

GROUP = 2


@dataclass
class Run:
    trained: list[int] = field(default_factory=list)  # episode length of each trained group
    sampled: list[int] = field(default_factory=list)  # episode length of each group whose sampling ended
    due_left_behind: int = 0  # batches with a fresher group while a ready due group waited
    stepped_past_due: int = 0  # batches taken while a due group was in flight
    dropped_stale: int = 0
    dropped_tokens: int = 0


def simulate(lengths: list[int], *, k: int, b: int, learner_ticks: int, wait: bool, steps: int = 12) -> Run:
    """`lengths[i]`: ticks (= sampled tokens) of every member of the i-th prompt; prompts cycle."""
    buf = RolloutBuffer(BufferConfig(max_staleness=k, wait_for_due=wait), batch_prompts=b, group_size=GROUP)
    run, task_len = Run(), {}  # group id -> episode length
    members: dict[str, tuple[Trajectory, list[int]]] = {}  # uid of a running member -> (it, [ticks left])
    next_task, learner_busy, step = 0, 0, 0
    for _ in range(steps * (max(lengths) + learner_ticks + 2) * (k + 2)):
        if step == steps:
            break
        while buf.can_admit():  # rollout workers: admit and start every member at once
            if buf.recycled:  # a dropped group's prompt is sampled again first, as PromptSource does
                task = buf.recycled.popleft()
            else:
                task, next_task = f"t{next_task}", next_task + 1
            gid = buf.try_admit(task)
            assert gid is not None
            task_len[gid] = lengths[int(task[1:]) % len(lengths)]
            for i in range(GROUP):
                t = buf.start(gid, i, [1])
                members[t.uid] = (t, [task_len[gid]])
        for t, left in list(members.values()):  # one tick of generation at the engines' (= buffer's) version
            doomed = buf.doomed(t.group_id)
            if not doomed:
                t.append_sampled([1], [-0.5], buf.version)
                left[0] -= 1
            if doomed or left[0] == 0:
                del members[t.uid]
                if all(m.uid not in members for m in _open_members(buf, t.group_id)):
                    run.sampled.append(task_len[t.group_id])
                if doomed:  # the workers stop a group that went over the bound
                    t.reward, t.finish_reason = 0.0, FinishReason.LENGTH
                    buf.abandon(t)
                else:
                    t.reward, t.finish_reason = float(t.uid.endswith("/0")), FinishReason.ANSWER
                    buf.finish(t)
        if learner_busy:  # the learner trains, then pushes the new version
            learner_busy -= 1
            if learner_busy == 0:
                step += 1
                buf.set_version(buf.version + 1)
            continue
        due_ready = {g for g, grp in buf._ready.items() if buf._due(grp.min_version)}
        due_open = any(not g.doomed and buf._due(g.min_version()) for g in buf.open_groups())
        batch = buf.try_take(b)
        if batch is None:
            continue
        ids = {g.group_id for g in batch}
        run.due_left_behind += bool(due_ready - ids) and bool(ids - due_ready)
        run.stepped_past_due += due_open
        run.trained += [task_len[g.group_id] for g in batch]
        learner_busy = learner_ticks
    run.trained += [task_len[g] for g in buf._ready]
    run.dropped_stale = buf.counters.dropped_stale
    run.dropped_tokens = buf.counters.dropped_sampled_tokens
    return run


def _open_members(buf: RolloutBuffer, gid: str) -> list[Trajectory]:
    return [m for g in buf.open_groups() if g.group_id == gid for m in g.members if m is not None]


def violations(run: Run) -> list[str]:
    out = []
    if run.due_left_behind:
        out.append(f"{run.due_left_behind} batch(es) took a fresher group over a ready due one")
    if run.stepped_past_due:
        out.append(f"the learner stepped {run.stepped_past_due} time(s) while a due group was in flight")
    if run.dropped_stale or run.dropped_tokens:
        out.append(f"{run.dropped_stale} group(s) dropped as stale, {run.dropped_tokens} sampled tokens lost")
    if Counter(run.trained) != Counter(run.sampled):
        out.append(f"trained lengths {sorted(run.trained)} != sampled lengths {sorted(run.sampled)}")
    return out


# long-tailed episode lengths: mostly short, a few many times longer (as multi-turn tool use)
LENGTHS = st.lists(
    st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(4, 16)), min_size=1, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(lengths=LENGTHS, k=st.integers(0, 3), b=st.integers(1, 3), learner_ticks=st.integers(1, 4))
def test_due_groups_are_trained_first_nothing_sampled_is_dropped_and_lengths_are_unbiased(
    lengths: list[int], k: int, b: int, learner_ticks: int
) -> None:
    run = simulate(lengths, k=k, b=b, learner_ticks=learner_ticks, wait=True)
    assert run.trained, "the simulated run trained nothing"
    assert violations(run) == []


def test_the_properties_fail_without_wait_for_due() -> None:
    """The same simulation with the feature off: the fast learner steps past the long episode, which goes
    over the bound and is dropped, so what is trained is shorter than what was sampled."""
    lengths, kw = [1, 1, 1, 12], dict(k=1, b=2, learner_ticks=1)
    assert violations(simulate(lengths, **kw, wait=True)) == []
    broken = violations(simulate(lengths, **kw, wait=False))
    assert any("stepped" in v for v in broken) and any("dropped as stale" in v for v in broken)
    assert any("trained lengths" in v for v in broken)
