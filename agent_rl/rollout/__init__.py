"""Rollout workers: episodes between engines and environments, feeding the buffer.

episodes.py  one episode (SimpleTIR turns, or an agent through the gateway): EpisodeRunner
workers.py   Rollouts: episodes on the driver's event loop; PromptSource; rates of the counters
sharded.py   ShardedRollouts: episodes in `rollout.workers` processes (shard.py), the buffer in the driver
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_rl.config import RolloutConfig


def build_rollouts(
    cfg: RolloutConfig,
    buffer: Any,
    prompts: Any,
    make_env: Callable[[], Any],
    engine: Any,
    *,
    spec: Any,
    tokenizer: Any,
    max_seq_len: int,
    seed: int,
) -> Any:
    """`workers.Rollouts` (rollout.workers: 1) or `sharded.ShardedRollouts` over that many processes; both are
    started on the loop (`start()`) and offer stop() and stats(). `spec`, `tokenizer`: what a process makes
    its envs from (make_env stays in the driver)."""
    if cfg.workers == 1:
        from agent_rl.rollout.workers import Rollouts

        return Rollouts(cfg, buffer, prompts, make_env, engine, max_seq_len=max_seq_len, seed=seed)
    from agent_rl.rollout.sharded import ShardedRollouts, WorkerEnv

    if getattr(spec, "external", None) is not None:
        raise ValueError(
            f"rollout.workers={cfg.workers}: env {spec.source_path or spec.name} is `type: external`, whose agents "
            "claim tasks from one gateway address; set rollout.workers: 1"
        )
    return ShardedRollouts(
        cfg, buffer, prompts, WorkerEnv(spec, tokenizer), engine, max_seq_len=max_seq_len, seed=seed
    )
