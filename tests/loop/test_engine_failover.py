"""An engine server process killed mid-run: the pool routes around it, the supervisor restarts it,
and the run finishes with every step trained (real engines, env, sandbox and learner).

The kill waits for an event, not a time: both engines have requests in flight. The requests that hit the
dead engine are retried on the other one (the pool's retries)."""

from __future__ import annotations

import threading
import time

import pytest

from agent_rl import hosts
from agent_rl.engines.elastic import Engines
from agent_rl.metrics import read_metrics
from agent_rl.trainer import train


@pytest.mark.slow  # two engine servers start (and one restarts): ~15 s each on a busy 2-core machine
def test_killed_engine_process_is_routed_around_and_restarted(smoke_recipe, monkeypatch) -> None:
    recipe = smoke_recipe("engines.count=2", "train.steps=30", "buffer.max_staleness=1", "checkpoint.every=0")
    started: list[Engines] = []
    real_start = hosts.start_engines

    async def recording_start(*args, **kwargs):  # the real start_engines; we only keep a handle to kill
        engines = await real_start(*args, **kwargs)
        started.append(engines)
        return engines

    monkeypatch.setattr(hosts, "start_engines", recording_start)

    killed: list[BaseException | int] = []  # the killed pid, or what stopped the killer thread

    def kill_one_engine_mid_run() -> None:
        try:
            while not started or not all(started[0].client.stats().in_flight):  # both engines are serving
                time.sleep(0.01)
            started[0].handles[0].process.kill()
            killed.append(started[0].handles[0].process.pid)
        except BaseException as e:  # a thread's exception is otherwise only printed: the test must see it
            killed.append(e)

    killer = threading.Thread(target=kill_one_engine_mid_run, daemon=True)
    killer.start()
    records = read_metrics(train(recipe))
    killer.join(timeout=1)
    assert killed and isinstance(killed[0], int), f"no engine was killed mid-run: {killed}"
    assert [r["step"] for r in records] == list(range(30)), "the run did not survive losing an engine"
    assert started[0].restarts == 1
    pool = started[0].client.stats()
    assert pool.retries >= 1, "no request that hit the dead engine was routed to the live one"
    assert (
        records[-1]["rollout/errors"] == 0
        or records[-1]["buffer/dropped_error"] == records[-1]["buffer/recycled"]
    )
