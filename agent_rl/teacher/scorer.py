"""The teacher's log-prob of every token the student sampled, requested as soon as a trajectory is finished.

A trajectory goes to the teacher whole (prompt, sampled turns, tool observations, template glue: the
same token ids the student saw, never re-tokenized) in one scoring request that starts at its first
sampled token; the scores of the sampled positions are kept (`Trajectory.set_teacher_logprobs`), the
positions of environment tokens are context and never targets. Requests run on the rollout loop
while other episodes still generate and while the learner steps: the teacher engines batch them
(one padded prefill per step of the embedded engine), so by the time the learner takes a group its
scores are usually there. A group's members go to the same engine, whose cache then holds their
shared prompt. Infrastructure errors are retried a bounded number of times, then fail the step.
"""

from __future__ import annotations

import asyncio
import functools
import time
import zlib
from collections.abc import Sequence

from agent_rl.engines.api import BadRequest
from agent_rl.rollout.episodes import BusyClock
from agent_rl.teacher.engines import Scorer
from agent_rl.types import FinishReason, Group, Trajectory


def sampled_positions(traj: Trajectory) -> list[int]:
    """Positions of the model-sampled tokens in prompt_ids + response_ids, in order."""
    pos, out = len(traj.prompt_ids), list[int]()
    for s in traj.segments:
        if s.sampled:
            out.extend(range(pos, pos + len(s.token_ids)))
        pos += len(s.token_ids)
    return out


class TeacherError(RuntimeError):
    """The teacher could not score a trajectory (after retries); the learner's step fails with it."""


class TeacherScorer:
    """Scores trajectories with the teacher engines; see the module docstring. Lives on the rollout loop."""

    def __init__(self, engines: Sequence[Scorer], *, max_concurrent: int = 64, max_retries: int = 3):
        if not engines:
            raise ValueError("TeacherScorer needs at least one teacher engine")
        self.engines, self.max_retries = list(engines), max_retries
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: dict[str, asyncio.Task] = {}  # uid -> scoring in flight
        self._failed: dict[str, BaseException] = {}
        self.busy = BusyClock()
        self.requests = self.tokens = self.retries = 0
        self.request_seconds = self.wait_seconds = 0.0
        self._snap = (0, 0, 0.0, 0.0, 0.0)
        self._closed = False

    def schedule(self, trajs: Sequence[Trajectory]) -> None:
        """Start scoring these finished trajectories now (an ERROR one is dropped by the buffer: skipped)."""
        for t in trajs:
            if self._closed:
                return
            if (
                t.finish_reason == FinishReason.ERROR
                or t.teacher_logprobs is not None
                or t.uid in self._tasks
            ):
                continue
            task = asyncio.create_task(self.score(t))
            self._tasks[t.uid] = task
            task.add_done_callback(functools.partial(self._done, t.uid))

    def _done(self, uid: str, task: asyncio.Task) -> None:
        self._tasks.pop(uid, None)
        if not task.cancelled() and task.exception() is not None:
            self._failed[uid] = task.exception()  # type: ignore[assignment]

    async def ensure(self, groups: Sequence[Group]) -> None:
        """Return once every trajectory of `groups` has its teacher scores: awaits those in flight, scores those
        never sent (restored from a checkpoint), raises what failed. The time spent here is `wait_seconds`."""
        t0 = time.monotonic()
        try:
            pending = []
            for t in (t for g in groups for t in g.trajectories):
                if t.teacher_logprobs is not None:
                    continue
                if (err := self._failed.pop(t.uid, None)) is not None:
                    raise TeacherError(f"the teacher could not score {t.uid}: {err}") from err
                pending.append(self._tasks.get(t.uid) or asyncio.ensure_future(self.score(t)))
            if pending:
                await asyncio.gather(*pending)
        finally:
            self.wait_seconds += time.monotonic() - t0

    async def score(self, traj: Trajectory) -> None:
        """Set `traj.teacher_logprobs`: the teacher's log-prob of each sampled token (a token at position 0,
        which nothing predicts, gets 0: collate keeps position 0 out of every loss)."""
        positions = sampled_positions(traj)
        if not positions:
            traj.set_teacher_logprobs([])
            return
        ids = traj.prompt_ids + traj.response_ids
        start = max(1, positions[0])
        if start >= len(ids):  # the only sampled token is at position 0
            traj.set_teacher_logprobs([0.0] * len(positions))
            return
        engine = self.engines[
            zlib.crc32(traj.group_id.encode()) % len(self.engines)
        ]  # a group shares its prompt
        scores = await self._request(engine, ids, start, f"teacher/{traj.uid}")
        traj.set_teacher_logprobs([scores[p - start] if p >= start else 0.0 for p in positions])
        self.tokens += len(positions)

    async def _request(self, engine: Scorer, ids: list[int], start: int, rid: str) -> list[float]:
        """engine.score with bounded, counted retries on infrastructure errors."""
        for attempt in range(self.max_retries + 1):
            try:
                return await self._once(engine, ids, start, f"{rid}.{attempt}")
            except (BadRequest, TeacherError):
                raise  # the request is wrong (longer than the teacher's context): retrying cannot help
            except Exception as e:  # connection lost, teacher died: retried, then the step fails
                if attempt == self.max_retries:
                    raise TeacherError(f"teacher request {rid} failed {attempt + 1} times: {e!r}") from e
                self.retries += 1
            await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    async def _once(self, engine: Scorer, ids: list[int], start: int, rid: str) -> list[float]:
        async with self._slots:
            self.busy.enter()
            t0 = time.monotonic()
            try:
                scores = await engine.score(ids, start=start, request_id=rid)
            finally:
                self.busy.leave()
                self.request_seconds += time.monotonic() - t0
                self.requests += 1
        if len(scores) != len(ids) - start:
            raise TeacherError(
                f"teacher request {rid}: {len(scores)} log-probs for {len(ids) - start} tokens"
            )
        return scores

    def stats(self) -> dict[str, float]:
        """Counters since the previous call: requests, scored sampled tokens, seconds with a request in flight,
        summed request latency, and the learner's wait for scores (`teacher/wait_seconds`)."""
        now = (self.requests, self.tokens, self.busy.total(), self.request_seconds, self.wait_seconds)
        d = [a - b for a, b in zip(now, self._snap, strict=True)]
        self._snap = now
        return {
            "teacher/requests": float(d[0]),
            "teacher/scored_tokens": float(d[1]),
            "teacher/busy_seconds": d[2],
            "teacher/request_seconds": d[3],
            "teacher/wait_seconds": d[4],
            "teacher/retries": float(self.retries),
            "teacher/in_flight": float(len(self._tasks)),
        }

    async def close(self) -> None:
        self._closed = True  # episodes still finishing while the run shuts down are not sent any more
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
