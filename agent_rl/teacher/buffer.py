"""The rollout buffer of a distillation run: trajectories go to the teacher the moment they finish.

Everything about staleness, admission and delivery is RolloutBuffer's; this adds two things. A
finished trajectory (with the extra trajectories its agent episode forked into) is sent to the
teacher at once, so scoring runs while the other episodes of the batch still generate and while
the learner trains on the previous batch. `take` hands over groups only when each of their
trajectories carries its teacher scores; the time it waits for them is `teacher/wait_seconds`,
the teacher's share of the learner's step. Scores travel inside the trajectories (checkpoints too).
"""

from __future__ import annotations

from typing import Any

from agent_rl.buffer import RolloutBuffer
from agent_rl.teacher.scorer import TeacherScorer
from agent_rl.types import Group, Trajectory


class TeacherBuffer(RolloutBuffer):
    def __init__(self, scorer: TeacherScorer, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.scorer = scorer
        self._forks: dict[str, list[Trajectory]] = {}  # member uid -> its episode's extra trajectories

    def fork(self, member: Trajectory, n: int) -> Trajectory:
        traj = super().fork(member, n)
        self._forks.setdefault(member.uid, []).append(traj)
        return traj

    def drop_forks(self, member: Trajectory) -> None:
        super().drop_forks(member)
        self._forks.pop(member.uid, None)

    def finish(self, traj: Trajectory) -> None:
        super().finish(traj)
        self.scorer.schedule([traj, *self._forks.pop(traj.uid, [])])

    def abandon(self, traj: Trajectory) -> None:
        super().abandon(traj)
        self._forks.pop(traj.uid, None)

    async def take(self, n_groups: int) -> list[Group]:
        batch = await super().take(n_groups)
        await self.scorer.ensure(batch)
        return batch

    def stats(self) -> dict[str, float]:
        return super().stats() | self.scorer.stats()
