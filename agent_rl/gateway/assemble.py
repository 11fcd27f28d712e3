"""Recorded calls -> the trajectories the learner trains on.

Each call's prompt either extends a trajectory built so far (its ids start with that trajectory's
prompt + sampled + in-between ids): then the in-between ids (tool results, template glue) are
appended as environment tokens (loss mask 0) and the call's sampled ids as sampled tokens with
their log-probs and versions. Or it extends none (the agent edited history, or the template
re-rendered earlier turns differently): then it starts a new trajectory, a *split*. All of an
episode's trajectories share its reward. Sampled ids are copied from the engines' output, never
decoded and re-encoded. Assembly is incremental (`add` per call), so the buffer sees the versions
of an episode's tokens while it runs (the staleness bound applies to agent episodes too).
"""

from __future__ import annotations

from collections.abc import Callable

from agent_rl.gateway.record import Call
from agent_rl.types import Trajectory


class Assembler:
    """Grows `first` (the buffer's member trajectory) and, on a split, new ones made by `fork()`."""

    def __init__(self, first: Trajectory, fork: Callable[[], Trajectory], constrained: str = "unmasked"):
        self.first, self._fork, self.constrained = first, fork, constrained
        self.trajectories: list[Trajectory] = []
        self._ids: list[list[int]] = []  # full token ids of each trajectory so far
        self.splits = 0

    def add(self, call: Call) -> Trajectory:
        prompt = list(call.prompt_ids)
        for traj, ids in zip(reversed(self.trajectories), reversed(self._ids), strict=True):
            if len(prompt) >= len(ids) and prompt[: len(ids)] == ids:
                traj.append_env(prompt[len(ids) :])
                traj.append_sampled(
                    list(call.token_ids), list(call.behaviour(self.constrained)), list(call.versions)
                )
                ids[:] = prompt + list(call.token_ids)
                traj.set_routed_experts(call.routed_experts)  # its new positions as this call routed them
                return traj
        if self.trajectories:
            self.splits += 1
            traj = self._fork()
        else:
            traj = self.first
        traj.prompt_ids = prompt
        traj.append_sampled(list(call.token_ids), list(call.behaviour(self.constrained)), list(call.versions))
        traj.set_routed_experts(call.routed_experts)
        self.trajectories.append(traj)
        self._ids.append(prompt + list(call.token_ids))
        return traj


def assemble(calls: list[Call], uid: str = "episode", group_id: str = "g") -> tuple[list[Trajectory], int]:
    """All calls of a finished episode at once: (trajectories, number of splits)."""
    first = Trajectory(uid=f"{group_id}/0" if uid == "episode" else uid, group_id=group_id, prompt_ids=[])
    n = 0

    def fork() -> Trajectory:
        nonlocal n
        n += 1
        return Trajectory(uid=f"{first.uid}.{n}", group_id=group_id, prompt_ids=[])

    asm = Assembler(first, fork)
    for c in calls:
        asm.add(c)
    return asm.trajectories, asm.splits
