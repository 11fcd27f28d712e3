"""EnginePool: sticky trajectories, least-loaded routing, retry on a dead engine, re-sync of a revived one."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from agent_rl.engines.api import EngineUnavailable, Generation, SamplingParams
from agent_rl.engines.client import SGLangClient
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.server import build_app
from agent_rl.engines.pool import EnginePool

SP = SamplingParams(max_new_tokens=4, ignore_eos=True)


class Recording:
    """Delegates to a real engine and records which request ids it served (a Protocol-level wrapper)."""

    def __init__(self, inner):
        self.inner, self.served = inner, []

    async def generate(self, input_ids, sampling, *, request_id) -> Generation:
        self.served.append(request_id)
        return await self.inner.generate(input_ids, sampling, request_id=request_id)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def two_engines(tiny_model_dir):
    engines = [EmbeddedEngine(tiny_model_dir, max_batch=8, max_seq_len=256) for _ in range(2)]
    yield engines
    for e in engines:
        await e.close()


async def test_turns_of_one_trajectory_stick_to_one_engine(two_engines):
    a, b = Recording(two_engines[0]), Recording(two_engines[1])
    pool = EnginePool([a, b])
    for turn in range(4):
        await asyncio.gather(
            pool.generate([5, 6, 7], SP, request_id=f"traj-x/{turn}"),
            pool.generate([8, 9], SP, request_id=f"traj-y/{turn}"),
        )
    await pool.close()
    for rec in (a, b):
        assert len({rid.split("/")[0] for rid in rec.served}) == 1  # each engine saw one trajectory only
    assert len(a.served) == len(b.served) == 4


async def test_new_trajectories_go_to_the_least_loaded_engine(two_engines):
    a, b = Recording(two_engines[0]), Recording(two_engines[1])
    pool = EnginePool([a, b])
    long = SamplingParams(max_new_tokens=50, ignore_eos=True)
    await asyncio.gather(*(pool.generate([5, 6], long, request_id=f"t{i}") for i in range(8)))
    await pool.close()
    assert len(a.served) == len(b.served) == 4


async def test_a_dead_engines_requests_are_retried_on_a_live_one(two_engines):
    dead = SGLangClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    pool = EnginePool([dead, two_engines[0]], max_retries=1)
    gens = await asyncio.gather(*(pool.generate([5, 6, 7], SP, request_id=f"r{i}") for i in range(4)))
    stats = pool.stats()
    await pool.close()
    assert all(len(g.token_ids) == 4 for g in gens)
    assert stats.alive == [False, True] and stats.retries >= 1


async def test_with_every_engine_dead_the_error_reaches_the_caller():
    pool = EnginePool([SGLangClient(f"http://127.0.0.1:{free_port()}")], max_retries=3)
    with pytest.raises(EngineUnavailable):
        await pool.generate([1, 2], SP, request_id="x")
    await pool.close()


async def test_a_revived_engine_first_receives_the_latest_weights(two_engines):
    port = free_port()
    served = two_engines[1]

    async def start() -> web.AppRunner:
        runner = web.AppRunner(build_app(served, "tiny"))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = await start()
    remote = SGLangClient(f"http://127.0.0.1:{port}")
    pool = EnginePool([two_engines[0], remote], health_interval_s=3600)
    await runner.cleanup()  # the server goes away ...
    params = {n: p.detach().clone() for n, p in two_engines[0].scheduler.model.named_parameters()}
    await pool.update_weights(version=5, tensors=params)  # ... and misses this update
    assert pool.stats().alive == [True, False] and served.version == 0 and two_engines[0].version == 5
    runner = await start()  # it comes back
    await pool.check_health()
    assert pool.stats().alive == [True, True] and pool.stats().revived == 1 and served.version == 5
    await runner.cleanup()
    await remote.close()
