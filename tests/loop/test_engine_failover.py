"""An engine server process killed mid-run: the pool routes around it, the supervisor restarts it,
and the run finishes with every step trained (real engines, env, sandbox and learner).

The kill waits for an event, not a time: both engines have requests in flight. The requests that hit the
dead engine are retried on the other one (the pool's retries)."""

from __future__ import annotations

import threading
import time

import pytest

from agent_rl import placement
from agent_rl.metrics import read_metrics
from agent_rl.trainer import train


@pytest.mark.slow  # two engine servers start (and one restarts): ~15 s each on a busy 2-core machine
def test_killed_engine_process_is_routed_around_and_restarted(smoke_recipe, monkeypatch) -> None:
    recipe = smoke_recipe("engines.count=2", "train.steps=30", "buffer.max_staleness=1", "checkpoint.every=0")
    started: list[placement.Engines] = []
    real_start = placement.start_engines

    async def recording_start(*args, **kwargs):  # the real start_engines; we only keep a handle to kill
        engines = await real_start(*args, **kwargs)
        started.append(engines)
        return engines

    monkeypatch.setattr(placement, "start_engines", recording_start)

    def kill_one_engine_mid_run() -> None:
        while not started or not all(started[0].client.in_flight):  # both engines are serving requests
            time.sleep(0.01)
        started[0].handles[0].process.kill()

    killer = threading.Thread(target=kill_one_engine_mid_run, daemon=True)
    killer.start()
    records = read_metrics(train(recipe))
    killer.join(timeout=1)
    assert [r["step"] for r in records] == list(range(30)), "the run did not survive losing an engine"
    assert started[0].restarts == 1
    pool = started[0].client.stats()
    assert pool.retries >= 1, "no request that hit the dead engine was routed to the live one"
    assert (
        records[-1]["rollout/errors"] == 0
        or records[-1]["buffer/dropped_error"] == records[-1]["buffer/recycled"]
    )
