"""Several engines behind one `EngineClient`: least-loaded routing, sticky trajectories, health checks, retries,
and members that join or leave a running job.

- Sticky: requests of one trajectory go to the engine that served its previous turn, where its
  prefix is still cached. The trajectory key is `sticky_key=` when given, else the request id up to
  its last "/" (so ids like "traj-17/turn-3" stick by "traj-17"; an id without "/" is its own key).
- Least-loaded: a new trajectory goes to the live engine with the fewest requests in flight.
- Dead engines: a connection failure (EngineUnavailable) marks the engine dead and the request is
  retried on another one, at most `max_retries` times; retries are counted in `stats()`. A
  background health check brings back an engine that answers again.
- Joining: an engine added to a running pool (`add`), or one that answers again, takes no work until it
  holds the latest weights: the last memory/disk update is replayed to it at once; under distributed updates
  (`engines.weight_sync: nccl`) the next push forms a new weight group with it (`needs_regroup`).
- Leaving (`remove`): no new turn goes to it; its in-flight turns finish (drain), or after `drain_s` are
  aborted and continued on the others (an aborted turn returns its tokens; the rollout worker re-submits it).
- Distributed weight updates: the pool is one `WeightGroupMember` whose members take consecutive ranks;
  a member lost, added or revived since the group formed makes `needs_regroup` true.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_rl.engines.api import (
    EngineClient,
    EngineError,
    EngineUnavailable,
    Generation,
    SamplingParams,
    WeightGroupMember,
)
from agent_rl.weights.group import GroupSpec, TensorMeta

log = logging.getLogger(__name__)
MAX_STICKY = 100_000  # trajectory keys remembered (LRU)
State = Literal["live", "joining", "leaving", "dead"]


@dataclass(eq=False)
class Member:
    engine: EngineClient
    name: str
    state: State = "live"
    in_flight: int = 0
    served: int = 0  # requests answered
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while nothing is in flight


@dataclass
class PoolStats:
    in_flight: list[int]
    alive: list[bool]
    retries: int
    revived: int
    states: list[str] = field(default_factory=list)


class EnginePool:
    def __init__(
        self,
        engines: Sequence[EngineClient],
        *,
        max_retries: int = 2,
        health_interval_s: float = 5.0,
        names: Sequence[str] | None = None,
    ):
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self.members = [Member(e, n) for e, n in zip(engines, names or _names(engines), strict=True)]
        for m in self.members:
            m.idle.set()
        self.max_retries, self.health_interval_s = max_retries, health_interval_s
        self.sticky: OrderedDict[str, Member] = OrderedDict()
        self.retries = self.revived = 0
        self._last_update: dict[str, Any] | None = None  # replayed to a joining engine
        self._last_adapter: dict[str, Any] | None = None  # LoRA: replayed to a joining engine
        self._health_task: asyncio.Task | None = None
        self._closed = False
        self._paused = False
        self._group: list[Member] | None = None  # members of the weight group (distributed updates)
        self._group_name: str | None = None
        self._group_broken = False  # a member died since the group formed

    @property
    def engines(self) -> list[EngineClient]:
        return [m.engine for m in self.members]

    @property
    def alive(self) -> list[bool]:
        return [m.state == "live" for m in self.members]

    # ---- EngineClient ----

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str,
        sticky_key: str | None = None,
    ) -> Generation:
        self._ensure_health_checks()
        key = sticky_key if sticky_key is not None else request_id.rsplit("/", 1)[0]
        for attempt in range(self.max_retries + 1):
            m = self._route(key)
            m.in_flight += 1
            m.idle.clear()
            try:
                gen = await m.engine.generate(input_ids, sampling, request_id=request_id)
                m.served += 1
                return gen
            except EngineUnavailable as e:
                if self._closed:  # the job is shutting its engines down: not a failure of this one
                    raise
                self._mark_dead(m, e)
                if attempt == self.max_retries or not any(x.state == "live" for x in self.members):
                    raise
                self.retries += 1
            finally:
                m.in_flight -= 1
                if m.in_flight == 0:
                    m.idle.set()
        raise AssertionError("unreachable")

    async def pause(self) -> None:
        self._paused = True
        await self._broadcast(lambda e: e.pause(), ("live", "joining", "leaving"))

    async def resume(self) -> None:
        self._paused = False
        await self._broadcast(lambda e: e.resume(), ("live", "joining", "leaving"))

    async def update_weights(
        self, *, version: int, path: str | None = None, tensors: Mapping[str, Any] | None = None
    ) -> None:
        self._last_update = {"version": version, "path": path, "tensors": tensors}
        done = await self._broadcast(
            lambda e: e.update_weights(version=version, path=path, tensors=tensors), ("live", "joining")
        )
        self._go_live(done)

    async def load_adapter(self, *, version: int, adapter: Any = None, path: str | None = None) -> None:
        """LoRA: every serving engine loads the adapter (weights/adapters.py); a joining engine gets it too."""
        from agent_rl.weights.adapters import loader

        self._last_adapter = {"version": version, "adapter": adapter, "path": path}
        done = await self._broadcast(
            lambda e: loader(e).load_adapter(version=version, adapter=adapter, path=path), ("live", "joining")
        )
        self._go_live(done)

    # ---- membership ----

    async def add(self, engine: EngineClient, name: str) -> Member:
        """A new member; it takes work once it holds the latest weights (at once under memory/disk updates,
        at the next push under distributed ones)."""
        m = Member(engine, name, "joining")
        m.idle.set()
        self.members.append(m)
        await self._catch_up(m)
        return m

    async def remove(self, member: Member, drain_s: float) -> int:
        """Stop routing to `member`, let its turns finish for up to `drain_s`, abort the rest (they continue on
        the others), then drop it. Returns how many turns were aborted."""
        was_live, member.state = member.state == "live", "leaving"
        if was_live and not any(m.state == "live" for m in self.members):
            member.state = "live"
            raise EngineError(f"{member.name} is the last live engine: add another before removing it")
        aborted = 0
        try:
            await asyncio.wait_for(member.idle.wait(), drain_s)
        except TimeoutError:
            aborted = member.in_flight
            try:
                await member.engine.pause()  # in-flight requests return what they have, finish_reason "abort"
                await member.idle.wait()
            except EngineUnavailable:
                pass
        self.members.remove(member)
        for k in [k for k, v in self.sticky.items() if v is member]:
            del self.sticky[k]
        await member.engine.close()
        return aborted

    @property
    def needs_regroup(self) -> bool:
        """A weight group has formed and its membership is no longer the set of serving members."""
        if self._group is None:
            return False
        return self._group_broken or self._serving() != self._group

    # ---- WeightGroupMember: every serving member joins, with consecutive rank offsets ----

    def host(self) -> str:
        serving = self._serving()
        if not serving:
            states = ", ".join(f"{m.name} {m.state}" for m in self.members)
            raise EngineUnavailable(f"no engine is serving to form a weight group with ({states})")
        return _member(serving[0].engine).host()

    async def weight_group_size(self) -> int:
        return sum(await self._group_sizes(self._serving()))

    async def init_weights_update_group(self, spec: GroupSpec, rank_offset: int) -> None:
        """Member i joins at rank_offset + the sizes of members 0..i-1 (live and joining ones only)."""
        members = self._serving()
        sizes = await self._group_sizes(members)
        offsets = itertools.accumulate(sizes[:-1], initial=rank_offset)
        await asyncio.gather(
            *(
                _member(m.engine).init_weights_update_group(spec, off)
                for m, off in zip(members, offsets, strict=True)
            )
        )
        self._group, self._group_name, self._group_broken = members, spec.group_name, False

    async def update_weights_from_distributed(
        self, meta: TensorMeta, *, version: int, group_name: str
    ) -> None:
        if self.needs_regroup or self._group is None:
            raise EngineError(
                "the engines' weight group does not match the serving engines (one was lost, added or came "
                "back): form a new group first (WeightBroadcast does so before each push)"
            )
        members = self._group
        results = await asyncio.gather(
            *(
                _member(m.engine).update_weights_from_distributed(
                    meta, version=version, group_name=group_name
                )
                for m in members
            ),
            return_exceptions=True,
        )
        for m, r in zip(members, results, strict=True):
            if isinstance(r, EngineUnavailable):
                self._mark_dead(m, r)
        if failed := [r for r in results if isinstance(r, BaseException)]:
            raise failed[0]
        self._go_live(members)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        members, self._group, self._group_name = self._group or [], None, None
        await asyncio.gather(
            *(_member(m.engine).destroy_weights_update_group(group_name) for m in members),
            return_exceptions=True,  # a dead member has nothing to leave
        )

    async def health(self) -> bool:
        results = await asyncio.gather(*(m.engine.health() for m in self.members))
        for m, ok in zip(self.members, results, strict=True):
            if not ok:
                self._mark_dead(m, EngineUnavailable("health check failed"))
        return any(m.state == "live" for m in self.members)

    async def close(self) -> None:
        self._closed = True  # episodes still finishing must not start a new health loop
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        await asyncio.gather(*(m.engine.close() for m in self.members), return_exceptions=True)

    def stats(self) -> PoolStats:
        ms = self.members
        return PoolStats(
            [m.in_flight for m in ms], self.alive, self.retries, self.revived, [m.state for m in ms]
        )

    # ---- routing and health ----

    def _serving(self) -> list[Member]:
        return [m for m in self.members if m.state in ("live", "joining")]

    async def _group_sizes(self, members: list[Member]) -> list[int]:
        return list(await asyncio.gather(*(_member(m.engine).weight_group_size() for m in members)))

    def _route(self, key: str) -> Member:
        live = [m for m in self.members if m.state == "live"]
        if not live:
            raise EngineUnavailable(f"no live engine among {len(self.members)}")
        m = self.sticky.get(key)
        if m is None or m.state != "live":
            m = min(live, key=lambda x: x.in_flight)
        self.sticky[key] = m
        self.sticky.move_to_end(key)
        if len(self.sticky) > MAX_STICKY:
            self.sticky.popitem(last=False)
        return m

    def _mark_dead(self, m: Member, err: BaseException) -> None:
        if m.state in ("live", "joining"):
            log.warning("engine %s marked dead: %s", m.name, err)
            m.state = "dead"
        if self._group is not None and m in self._group:  # a restarted server is in no group: it must rejoin
            self._group_broken = True

    def _go_live(self, members: list[Member]) -> None:
        for m in members:
            if m.state == "joining":
                m.state = "live"
                log.info("engine %s holds the latest weights and takes work", m.name)

    async def _broadcast(self, op: Callable[[EngineClient], Any], states: tuple[str, ...]) -> list[Member]:
        """Run `op` on every member in `states`; one that is unreachable is marked dead. Returns those that
        succeeded."""
        ms = [m for m in self.members if m.state in states]
        results = await asyncio.gather(*(op(m.engine) for m in ms), return_exceptions=True)
        for m, r in zip(ms, results, strict=True):
            if isinstance(r, EngineUnavailable):
                self._mark_dead(m, r)
            elif isinstance(r, BaseException):
                raise r
        return [m for m, r in zip(ms, results, strict=True) if not isinstance(r, BaseException)]

    async def _catch_up(self, m: Member) -> None:
        """Bring a joining member up to date: replay the last memory/disk update (distributed updates: the next
        push regroups with it). With no update yet, the model it loaded is the current policy."""
        if self._group is not None:
            return
        try:
            if self._last_update is not None:
                await m.engine.update_weights(**self._last_update)
            if self._last_adapter is not None:
                from agent_rl.weights.adapters import loader

                await loader(m.engine).load_adapter(**self._last_adapter)
            await (m.engine.pause() if self._paused else m.engine.resume())
        except EngineUnavailable as e:
            self._mark_dead(m, e)
            return
        self._go_live([m])

    def _ensure_health_checks(self) -> None:
        if self._closed:
            return
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()

    async def check_health(self) -> None:
        """Probe every member: mark silent ones dead; an answering dead one joins again (latest weights first)."""
        ms = list(self.members)
        results = await asyncio.gather(*(m.engine.health() for m in ms))
        for m, ok in zip(ms, results, strict=True):
            if not ok:
                self._mark_dead(m, EngineUnavailable("health check failed"))
            elif m.state == "dead":
                m.state = "joining"
                await self._catch_up(m)
                if m.state != "dead":
                    self.revived += 1
                    log.info("engine %s is back (%s)", m.name, m.state)


def _names(engines: Sequence[EngineClient]) -> list[str]:
    return [getattr(e, "url", None) or f"engine {i}" for i, e in enumerate(engines)]


def _member(engine: EngineClient) -> WeightGroupMember:
    if not isinstance(engine, WeightGroupMember):
        raise EngineError(
            f"{type(engine).__name__} cannot receive weights by broadcast (no /init_weights_update_group); "
            "use engines.weight_sync: memory or disk"
        )
    return engine
