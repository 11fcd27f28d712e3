"""Publishing the learner's weights to the engines (`engines.weight_sync`, `engines.sync_every`).

publish.py    the publisher the loop uses: memory | disk | broadcast, chosen once per run
lagged.py     rollout.fixed_lag (research): engines sample with weights exactly k versions old
broadcast.py  the broadcast path: learner rank 0 -> engine processes (SGLang's weight-group protocol)

This package drives both sides (a learner and the engines' client), so it sits above both; the formats
and transports both sides share (safetensors directories, the /dev/shm hand-off, LoRA adapter files, the
broadcast group's wire protocol) live below them in agent_rl/weights/.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_rl.config import EngineConfig
    from agent_rl.engines.api import EngineClient
    from agent_rl.loop_thread import LoopThread
    from agent_rl.weight_sync.publish import Publisher


def make_publisher(
    eng: EngineConfig, fixed_lag: int | None, engine: EngineClient, loop: LoopThread, *, scratch: Path
) -> Publisher:
    """The run's publisher: `engines.weight_sync` and `engines.sync_every`; `rollout.fixed_lag` -> lagged."""
    if fixed_lag is None:
        from agent_rl.weight_sync.publish import Publisher

        return Publisher(engine, loop, mode=eng.weight_sync, every=eng.sync_every, scratch=scratch)
    from agent_rl.weight_sync.lagged import LaggedPublisher

    return LaggedPublisher(engine, loop, mode=eng.weight_sync, lag=fixed_lag, scratch=scratch)
