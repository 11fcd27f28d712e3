"""An infrastructure failure in a rollout process (rollout.workers: 2) reaches the driver's buffer with its cause.

The engine is test_sharded_rollouts' FakeEngine (scripted tokens at the EngineClient boundary, in the driver: a
code turn, then an answer); the env and its sandbox run in the processes for real, and its reward function
returns NaN, so every episode that is scored fails as `bad_reward`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_sharded_rollouts import ANSWER, CODE, FakeEngine
from transformers import AutoTokenizer

import envs
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.failures import InfraFailureRate
from agent_rl.rollout.sharded import ShardedRollouts, WorkerEnv
from agent_rl.rollout.workers import PromptSource

NAN_ENV = Path(__file__).parent / "data" / "nan_reward.yaml"


async def test_a_failure_in_a_rollout_process_reaches_the_driver_with_its_cause(tiny_model_dir: Path) -> None:
    spec = envs.load(NAN_ENV)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    engine = FakeEngine(enc(CODE), enc(ANSWER), enc("```output")[-1])
    buffer = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=spec.group_size)
    cfg = RolloutConfig(
        workers=2, max_concurrent_episodes=8, infra_retries=1, infra_backoff_s=0.0, infra_backoff_max_s=0.0
    )
    r = ShardedRollouts(
        cfg, buffer, PromptSource(envs.make(spec, tok).tasks("train"), seed=0), WorkerEnv(spec, tok), engine,
        max_seq_len=256, seed=0,
    )  # fmt: skip
    r.start()
    try:
        with pytest.raises(InfraFailureRate) as caught:
            await asyncio.wait_for(buffer.take(1), 120)
    finally:
        await r.stop()
    # one group at a time (k=0, one prompt a batch): the first all-failed group makes 4 of 8, the second 8 of 12;
    # the driver's copies of the trajectories carry the cause the processes found (not "other")
    assert str(caught.value).startswith(
        "8 of the 12 episodes of a batch failed in the infrastructure (bad_reward 8)"
    )
    assert r.counters.infra_failed["bad_reward"] == 8 and r.counters.infra_retries == 8
