"""A rollout process: runs the episodes the driver hands it, reports to the driver's buffer, samples through it.

    python -m agent_rl.rollout.shard SOCKET     (started by sharded.ShardedRollouts, one per rollout.workers)

The process makes its own envs, tokenizer, sandbox and gateway and runs `episodes.EpisodeRunner`
unchanged; two stand-ins connect the runner to the driver over one Unix socket (length-prefixed
pickles: both ends are this package, started by the driver):

- `RemoteBuffer` keeps the episode's trajectory here and sends what changed (`Update`: new segments and
  turns, extras, the outcome) whenever the runner is about to wait, so the driver's copy, which the
  staleness bound and checkpoints read, is what an in-process buffer would hold at that point; `doomed`
  answers from the groups the driver declared over the bound (`Doom`).
- `EngineProxy` is an `EngineClient` whose generate and health calls are answered by the driver's
  engine client: weights, pauses and versions stay the driver's business.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from agent_rl.config import RolloutConfig
from agent_rl.engines.api import EngineError, Generation, SamplingParams
from agent_rl.rollout.episodes import EpisodeRunner, RolloutCounters
from agent_rl.types import FinishReason, InfraCause, RoutedExperts, Segment, Trajectory, TurnInfo


# -- messages -------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerEnv:
    """What a rollout process needs to make its own envs: the env spec and the driver's tokenizer (sent
    pickled: the same tokenizer, and no transformers.AutoTokenizer import, which pulls in torch, ~10 s)."""

    spec: Any  # envs.EnvSpec
    tokenizer: Any  # a Hugging Face tokenizer


@dataclass(frozen=True)
class Setup:  # driver -> worker, first
    cfg: RolloutConfig
    env: WorkerEnv
    max_seq_len: int
    seed: int


@dataclass(frozen=True)
class RunEpisode:  # driver -> worker
    group_id: str
    task: Any  # envs.Task
    index: int
    restored: bytes | None  # Trajectory.to_bytes() of a checkpointed partial episode


@dataclass(frozen=True)
class Doom:  # driver -> worker: the group went over the staleness bound
    group_id: str


@dataclass(frozen=True)
class Answer:  # driver -> worker: a proxied engine call's result
    rid: int
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class EngineCall:  # worker -> driver
    rid: int
    method: str  # "generate" | "health"
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Update:  # worker -> driver: the trajectory `uid` as it stands now, as a change of the driver's copy
    uid: str
    prompt_ids: list[int] | None  # None: unchanged
    from_segment: int  # segments[from_segment:] are replaced by `segments`
    segments: list[Segment]
    from_turn: int
    turns: list[TurnInfo]
    extras: dict[str, float]
    reward: float | None
    finish_reason: FinishReason | None
    masked: bool
    routed_experts: RoutedExperts | None = None  # MoE: the trajectory's new routing record (None: unchanged)
    infra_cause: InfraCause | None = None  # with finish_reason INFRA_FAILED: what failed


@dataclass(frozen=True)
class Fork:  # worker -> driver: buffer.fork(member, n)
    member_uid: str
    n: int


@dataclass(frozen=True)
class DropForks:  # worker -> driver
    member_uid: str


@dataclass(frozen=True)
class Done:  # worker -> driver: buffer.finish (finished) or buffer.abandon, with this process's counter totals
    uid: str
    finished: bool
    counters: RolloutCounters
    last_error: str | None


@dataclass(frozen=True)
class Failed:  # worker -> driver: a bug or too many errors; the run stops with this message
    message: str


class Link:
    """Length-prefixed pickles over an asyncio stream; the messages sent in one turn of the event loop go
    as one pickled list (one write, one read and one wake-up on the other side for all of them)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self._out: list[Any] = []

    def send(self, msg: Any) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(msg)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if not self.writer.is_closing():
            data = pickle.dumps(out, protocol=5)
            self.writer.write(len(data).to_bytes(4, "little") + data)

    async def recv(self) -> list[Any]:
        n = int.from_bytes(await self.reader.readexactly(4), "little")
        return pickle.loads(await self.reader.readexactly(n))


# -- the stand-ins --------------------------------------------------------------------------
class EngineProxy:
    """`EngineClient` whose calls the driver answers; the driver owns weights, pauses and closing."""

    def __init__(self, link: Link):
        self.link, self._next = link, 0
        self.pending: dict[int, asyncio.Future] = {}

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._next += 1
        fut = self.pending[self._next] = asyncio.get_running_loop().create_future()
        self.link.send(EngineCall(self._next, method, args, kwargs))
        return await fut

    def answer(self, a: Answer) -> None:
        fut = self.pending.pop(a.rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(a.error) if a.error is not None else fut.set_result(a.value)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        return await self._call("generate", input_ids, sampling, request_id=request_id)

    async def health(self) -> bool:
        return await self._call("health")

    async def pause(self) -> None:
        raise EngineError("a rollout process does not manage the engines (the driver does)")

    resume = pause

    async def update_weights(self, *, version: int, path: str | None = None, tensors: Any = None) -> None:
        raise EngineError("a rollout process does not manage the engines (the driver does)")

    async def close(self) -> None:
        return None


@dataclass
class _Sent:
    """What the driver already has of one trajectory (objects compared by identity: appends make new ones)."""

    prompt_ids: list[int] | None = None
    segments: list[Segment] = field(default_factory=list)
    turns: list[TurnInfo] = field(default_factory=list)
    routed_experts: RoutedExperts | None = None


class RemoteBuffer:
    """The driver's buffer as an episode sees it (episodes.EpisodeBuffer)."""

    def __init__(self, link: Link):
        self.link = link
        self.doomed_groups: set[str] = set()
        self.task_ids: dict[str, str] = {}  # group id -> task id, of the episodes running here
        self.runner: EpisodeRunner | None = None  # whose counters each Done carries (set once it exists)
        self._sent: dict[str, _Sent] = {}
        self._forks: dict[str, list[Trajectory]] = {}  # member uid -> its forks

    def restored(self, traj: Trajectory) -> Trajectory:
        """A checkpointed trajectory resumes here: the driver's copy is what it holds now."""
        self._sent[traj.uid] = _Sent(traj.prompt_ids, list(traj.segments), list(traj.turns))
        return traj

    def start(self, group_id: str, index: int, prompt_ids: list[int]) -> Trajectory:
        traj = Trajectory(
            uid=f"{group_id}/{index}",
            group_id=group_id,
            prompt_ids=list(prompt_ids),
            task_id=self.task_ids[group_id],
        )
        self._sent[traj.uid] = _Sent()
        return traj

    def doomed(self, group_id: str) -> bool:
        return group_id in self.doomed_groups

    def update(self, traj: Trajectory) -> None:
        sent = self._sent[traj.uid]
        k = 0
        while k < min(len(sent.segments), len(traj.segments)) and sent.segments[k] is traj.segments[k]:
            k += 1
        t = 0
        while t < min(len(sent.turns), len(traj.turns)) and sent.turns[t] is traj.turns[t]:
            t += 1
        prompt = None if sent.prompt_ids is traj.prompt_ids else traj.prompt_ids
        self.link.send(
            Update(
                traj.uid, prompt, k, traj.segments[k:], t, traj.turns[t:], dict(traj.extras),
                traj.reward, traj.finish_reason, traj.masked,
                None if sent.routed_experts is traj.routed_experts else traj.routed_experts, traj.infra_cause,
            )
        )  # fmt: skip
        sent.prompt_ids, sent.segments, sent.turns = traj.prompt_ids, list(traj.segments), list(traj.turns)
        sent.routed_experts = traj.routed_experts

    def fork(self, member: Trajectory, n: int) -> Trajectory:
        traj = Trajectory(
            uid=f"{member.uid}.{n}", group_id=member.group_id, prompt_ids=[], task_id=member.task_id
        )
        self._forks.setdefault(member.uid, []).append(traj)
        self._sent[traj.uid] = _Sent(prompt_ids=traj.prompt_ids)
        self.link.send(Fork(member.uid, n))
        return traj

    def drop_forks(self, member: Trajectory) -> None:
        for f in self._forks.pop(member.uid, []):
            del self._sent[f.uid]
        self.link.send(DropForks(member.uid))

    def finish(self, traj: Trajectory) -> None:
        self._report(traj, True)

    def abandon(self, traj: Trajectory) -> None:
        self._report(traj, False)

    def _report(self, traj: Trajectory, finished: bool) -> None:
        for f in self._forks.pop(traj.uid, []):  # forks share the episode's outcome: they go first
            self.update(f)
            del self._sent[f.uid]
        self.update(traj)
        del self._sent[traj.uid]
        r = self.runner
        self.link.send(
            Done(traj.uid, finished, r.counters if r else RolloutCounters(), r.last_error if r else None)
        )

    def fail(self, error: BaseException) -> None:
        self.link.send(Failed(f"rollout process {os.getpid()}: {error}"))


# -- the process ----------------------------------------------------------------------------
async def serve(path: str) -> None:
    """Connect to the driver at `path`, take its Setup, run episodes until Stop or the driver is gone."""
    import envs

    reader, writer = await asyncio.open_unix_connection(path)
    link = Link(reader, writer)
    (setup,) = await link.recv()
    spec, tokenizer = setup.env.spec, setup.env.tokenizer
    sandbox = envs.make_sandbox(spec)
    engine, buffer = EngineProxy(link), RemoteBuffer(link)
    runner = EpisodeRunner(
        setup.cfg, buffer, lambda: envs.make(spec, tokenizer, sandbox), engine,
        max_seq_len=setup.max_seq_len, seed=setup.seed,
    )  # fmt: skip
    buffer.runner = runner
    tasks: set[asyncio.Task] = set()

    async def episode(msg: RunEpisode) -> None:
        try:
            traj = None if msg.restored is None else buffer.restored(Trajectory.from_bytes(msg.restored))
            await runner.run(msg.group_id, msg.task, msg.index, traj)
        except Exception:  # a bug: the driver stops the run with it
            link.send(Failed(f"rollout process {os.getpid()}: {traceback.format_exc()}"))

    link.send(os.getpid())  # ready
    try:
        while True:
            try:
                msgs = await link.recv()
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the driver is gone (stopped or killed)
            for msg in msgs:
                if isinstance(msg, Answer):
                    engine.answer(msg)
                elif isinstance(msg, RunEpisode):
                    buffer.task_ids[msg.group_id] = msg.task.id
                    task = asyncio.create_task(episode(msg))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                elif isinstance(msg, Doom):
                    buffer.doomed_groups.add(msg.group_id)
                elif msg is None:  # stop
                    return
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.close()
        await sandbox.close()
        await envs.close_shared_sandboxes()
        writer.close()


if __name__ == "__main__":
    from agent_rl.rollout import (
        shard,  # this file as its module, not __main__: messages unpickle to its classes
    )

    asyncio.run(shard.serve(sys.argv[1]))
