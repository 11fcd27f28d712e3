"""Several engines behind one `EngineClient`: least-loaded routing, sticky trajectories, health checks, retries.

- Sticky: requests of one trajectory go to the engine that served its previous turn, where its
  prefix is still cached. The trajectory key is `sticky_key=` when given, else the request id up to
  its last "/" (so ids like "traj-17/turn-3" stick by "traj-17"; an id without "/" is its own key).
- Least-loaded: a new trajectory goes to the live engine with the fewest requests in flight.
- Dead engines: a connection failure (EngineUnavailable) marks the engine dead and the request is
  retried on another one, at most `max_retries` times; retries are counted in `stats()`. A
  background health check revives an engine that answers again and first pushes it the latest
  weights, so it never serves a stale version.
- Distributed weight updates: the pool is one `WeightGroupMember` whose engines take consecutive
  ranks. Once the group has formed, a dead engine stays dead (it cannot rejoin) and the next
  update fails with a message saying so.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass
class PoolStats:
    in_flight: list[int]
    alive: list[bool]
    retries: int
    revived: int


class EnginePool:
    def __init__(
        self, engines: Sequence[EngineClient], *, max_retries: int = 2, health_interval_s: float = 5.0
    ):
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self.engines = list(engines)
        self.max_retries, self.health_interval_s = max_retries, health_interval_s
        self.in_flight = [0] * len(engines)
        self.alive = [True] * len(engines)
        self.sticky: OrderedDict[str, int] = OrderedDict()
        self.retries = self.revived = 0
        self._last_update: dict[str, Any] | None = None  # replayed to a revived engine
        self._last_adapter: dict[str, Any] | None = None  # LoRA: replayed to a revived engine
        self._health_task: asyncio.Task | None = None
        self._closed = False
        self._paused = False
        self._group: str | None = None  # weight group joined by every engine (distributed updates)

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
            i = self._route(key)
            self.in_flight[i] += 1
            try:
                return await self.engines[i].generate(input_ids, sampling, request_id=request_id)
            except EngineUnavailable as e:
                self._mark_dead(i, e)
                if attempt == self.max_retries or not any(self.alive):
                    raise
                self.retries += 1
            finally:
                self.in_flight[i] -= 1
        raise AssertionError("unreachable")

    async def pause(self) -> None:
        self._paused = True
        await self._broadcast(lambda e: e.pause())

    async def resume(self) -> None:
        self._paused = False
        await self._broadcast(lambda e: e.resume())

    async def update_weights(
        self, *, version: int, path: str | None = None, tensors: Mapping[str, Any] | None = None
    ) -> None:
        self._last_update = {"version": version, "path": path, "tensors": tensors}
        await self._broadcast(lambda e: e.update_weights(version=version, path=path, tensors=tensors))

    async def load_adapter(self, *, version: int, adapter: Any = None, path: str | None = None) -> None:
        """LoRA: every engine loads the adapter (weights/adapters.py); a revived engine gets it too."""
        from agent_rl.weights.adapters import loader

        self._last_adapter = {"version": version, "adapter": adapter, "path": path}
        await self._broadcast(lambda e: loader(e).load_adapter(version=version, adapter=adapter, path=path))

    # ---- WeightGroupMember: every engine joins, with consecutive rank offsets ----

    def host(self) -> str:
        return _member(self.engines[0]).host()

    async def weight_group_size(self) -> int:
        return sum(await self._group_sizes())

    async def init_weights_update_group(self, spec: GroupSpec, rank_offset: int) -> None:
        """Engine i joins at rank_offset + the sizes of engines 0..i-1. From now on a dead engine is not
        revived: a replacement could not join a group that has already formed."""
        sizes = await self._group_sizes()
        offsets = itertools.accumulate(sizes[:-1], initial=rank_offset)
        await asyncio.gather(
            *(
                _member(e).init_weights_update_group(spec, off)
                for e, off in zip(self.engines, offsets, strict=True)
            )
        )
        self._group = spec.group_name

    async def update_weights_from_distributed(
        self, meta: TensorMeta, *, version: int, group_name: str
    ) -> None:
        dead = [i for i, a in enumerate(self.alive) if not a]
        if dead:
            raise EngineError(
                f"engines {dead} are dead: a broadcast needs every member of the weight group, and a restarted "
                "engine cannot join it; restart the run (--resume) to form a new group"
            )
        await asyncio.gather(
            *(
                _member(e).update_weights_from_distributed(meta, version=version, group_name=group_name)
                for e in self.engines
            )
        )

    async def destroy_weights_update_group(self, group_name: str) -> None:
        self._group = None
        await self._broadcast(lambda e: _member(e).destroy_weights_update_group(group_name))

    async def _group_sizes(self) -> list[int]:
        return list(await asyncio.gather(*(_member(e).weight_group_size() for e in self.engines)))

    async def health(self) -> bool:
        results = await asyncio.gather(*(e.health() for e in self.engines))
        self.alive = [bool(r) and a for r, a in zip(results, self.alive, strict=True)]
        return any(self.alive)

    async def close(self) -> None:
        self._closed = True  # episodes still finishing must not start a new health loop
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        await asyncio.gather(*(e.close() for e in self.engines), return_exceptions=True)

    def stats(self) -> PoolStats:
        return PoolStats(list(self.in_flight), list(self.alive), self.retries, self.revived)

    # ---- routing and health ----

    def _route(self, key: str) -> int:
        live = [i for i, a in enumerate(self.alive) if a]
        if not live:
            raise EngineUnavailable(f"no live engine among {len(self.engines)}")
        i = self.sticky.get(key)
        if i is None or not self.alive[i]:
            i = min(live, key=lambda j: self.in_flight[j])
        self.sticky[key] = i
        self.sticky.move_to_end(key)
        if len(self.sticky) > MAX_STICKY:
            self.sticky.popitem(last=False)
        return i

    def _mark_dead(self, i: int, err: BaseException) -> None:
        if self.alive[i]:
            log.warning("engine %d marked dead: %s", i, err)
        self.alive[i] = False

    async def _broadcast(self, op) -> None:
        """Run `op` on every live engine; one that is unreachable is marked dead (and re-synced on revival)."""
        live = [i for i, a in enumerate(self.alive) if a]
        results = await asyncio.gather(*(op(self.engines[i]) for i in live), return_exceptions=True)
        for i, r in zip(live, results, strict=True):
            if isinstance(r, EngineUnavailable):
                self._mark_dead(i, r)
            elif isinstance(r, BaseException):
                raise r

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
        """Probe every engine: mark silent ones dead, bring answering dead ones back in sync and revive them."""
        results = await asyncio.gather(*(e.health() for e in self.engines))
        for i, ok in enumerate(results):
            if not ok:
                self._mark_dead(i, EngineUnavailable("health check failed"))
            elif not self.alive[i]:
                if self._group is not None:
                    log.error("engine %d answers again but cannot rejoin weight group %r", i, self._group)
                    continue
                try:
                    if self._last_update is not None:
                        await self.engines[i].update_weights(**self._last_update)
                    if self._last_adapter is not None:
                        from agent_rl.weights.adapters import loader

                        await loader(self.engines[i]).load_adapter(**self._last_adapter)
                    await (self.engines[i].pause() if self._paused else self.engines[i].resume())
                except EngineUnavailable:
                    continue
                self.alive[i] = True
                self.revived += 1
                log.info("engine %d is back", i)


def _member(engine: EngineClient) -> WeightGroupMember:
    if not isinstance(engine, WeightGroupMember):
        raise EngineError(
            f"{type(engine).__name__} cannot receive weights by broadcast (no /init_weights_update_group); "
            "use engines.weight_sync: memory or disk"
        )
    return engine
