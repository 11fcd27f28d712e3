"""EnginePool: sticky trajectories, least-loaded routing, retry on a dead engine, re-sync of a revived one."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from agent_rl.engines.api import EngineError, EngineOptions, EngineUnavailable, Generation, SamplingParams
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
    engines = [
        EmbeddedEngine(
            tiny_model_dir,
            EngineOptions(max_batch=8, max_seq_len=256),
        )
        for _ in range(2)
    ]
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


async def test_an_added_engine_holds_the_latest_weights_before_it_takes_work(two_engines):
    old, new = Recording(two_engines[0]), Recording(two_engines[1])
    pool = EnginePool([old])
    params = {n: p.detach().clone() for n, p in two_engines[0].scheduler.model.named_parameters()}
    await pool.update_weights(version=7, tensors=params)
    assert two_engines[1].version == 0
    await pool.add(new, "new")
    assert two_engines[1].version == 7 and pool.stats().states == ["live", "live"]  # caught up, then routable
    gens = await asyncio.gather(*(pool.generate([5, 6], SP, request_id=f"t{i}/0") for i in range(4)))
    await pool.close()
    assert new.served and {v for g in gens for v in g.versions} == {7}


async def test_a_leaving_engine_drains_then_its_turn_is_aborted_and_continued_on_another(two_engines):
    leaving, staying = Recording(two_engines[0]), Recording(two_engines[1])
    pool = EnginePool([leaving, staying], names=["leaving", "staying"])
    long = SamplingParams(max_new_tokens=400, ignore_eos=True)
    turn = asyncio.create_task(pool.generate([5, 6, 7], long, request_id="traj-1/0"))
    while pool.members[0].in_flight == 0:  # the turn is running on the engine that will leave
        await asyncio.sleep(0.01)
    aborted = await pool.remove(pool.members[0], drain_s=0.0)
    first = await turn
    assert aborted == 1 and first.finish_reason == "abort" and len(first.token_ids) < 400
    rest = await pool.generate([5, 6, 7, *first.token_ids], long, request_id="traj-1/1")  # the continuation
    await pool.close()
    assert staying.served == ["traj-1/1"] and [m.name for m in pool.members] == ["staying"]
    assert rest.finish_reason == "length"


async def test_the_last_live_engine_cannot_be_removed(two_engines):
    pool = EnginePool([two_engines[0]])
    with pytest.raises(EngineError, match="last live engine: add another before removing it"):
        await pool.remove(pool.members[0], drain_s=0.0)
    await pool.close()


async def test_with_no_engine_serving_a_weight_group_cannot_form_and_says_why():
    pool = EnginePool([SGLangClient(f"http://127.0.0.1:{free_port()}")], max_retries=0)
    with pytest.raises(EngineUnavailable):
        await pool.generate([1, 2], SP, request_id="x")  # marks the one engine dead
    with pytest.raises(
        EngineUnavailable, match=r"no engine is serving to form a weight group with \(.* dead\)"
    ):
        pool.host()  # was an IndexError, a traceback out of a run's weight push
    await pool.close()
