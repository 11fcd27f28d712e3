"""Make every weight push of `train()` land mid-turn on the in-process engine (a test helper).

The engine parks (takes no step) once a running request has sampled a token, except while the learner
waits in `buffer.take` for groups; a push then always finds turns in flight, aborts them, and the rollout
workers continue them under the new version. Partial rollouts thus happen in every run however fast the
machine generates, and nothing waits for a fixed time: the engine runs whenever the learner needs data.
Generation, training and the pushes are the real ones; only the order of engine steps is constrained.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import agent_rl.runtime
import agent_rl.weight_sync.publish
from agent_rl.buffer import RolloutBuffer
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.scheduler import Scheduler
from agent_rl.weight_sync.publish import Publisher


def push_mid_turn(mp: pytest.MonkeyPatch) -> None:
    state = {"free": True, "engine": None}  # free: the learner waits for groups, the engine must run
    has_work = Scheduler.has_work

    def parked_has_work(self: Scheduler) -> bool:
        if not state["free"] and any(r.tokens for r in self.running):
            return False  # parked mid-turn until the learner needs groups (a command, e.g. pause, still runs)
        return has_work(self)

    def set_free(free: bool) -> None:
        state["free"] = free
        engine = state["engine"]
        if free and engine is not None:
            engine.submit(lambda: None)  # wake the engine thread

    class Buffer(RolloutBuffer):
        async def take(self, n_groups: int):  # type: ignore[no-untyped-def]
            batch = self.try_take(n_groups)
            if batch is None:
                set_free(True)
                try:
                    batch = await super().take(n_groups)
                finally:
                    set_free(False)
            return batch

    class Sync(Publisher):
        def __init__(self, engine, *args, **kwargs):  # type: ignore[no-untyped-def]
            assert isinstance(engine, EmbeddedEngine), "push_mid_turn needs the in-process embedded engine"
            state["engine"] = engine
            super().__init__(engine, *args, **kwargs)

    mp.setattr(Scheduler, "has_work", parked_has_work)
    mp.setattr(agent_rl.runtime, "RolloutBuffer", Buffer)
    mp.setattr(agent_rl.weight_sync.publish, "Publisher", Sync)


def push_mid_turn_servers(mp: pytest.MonkeyPatch, control: Path) -> None:
    """The same for engine server processes (`placement.topology: processes`): they start with
    tests/engine_park on PYTHONPATH, whose sitecustomize parks their engine mid-turn while the file `control`
    exists; the learner removes it while it waits in `buffer.take` and creates it again after."""
    park = Path(__file__).with_name("engine_park")
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(park), os.environ.get("PYTHONPATH")])))
    mp.setenv("AGENT_RL_TEST_PARK", str(control))
    control.touch()

    class Buffer(RolloutBuffer):
        async def take(self, n_groups: int):  # type: ignore[no-untyped-def]
            batch = self.try_take(n_groups)
            if batch is None:
                control.unlink(missing_ok=True)
                try:
                    batch = await super().take(n_groups)
                finally:
                    control.touch()
            return batch

    mp.setattr(agent_rl.runtime, "RolloutBuffer", Buffer)
