"""Replay a teacher trace through a real env, one model segment per step (the tiny envs' replay tests share it)."""

from __future__ import annotations

import envs
from envs.types import StepResult


async def replay(trace, spec, tok, sandbox) -> tuple[list[int], list[int], StepResult]:
    """The episode's token ids, its loss mask (1 = sampled) and the last step's result, built by the env from
    the trace's model segments (EOS after the last), with the sandbox running every call."""
    env = envs.make(spec, tok, sandbox=sandbox)
    ids = env.reset(trace.task)
    mask = [0] * len(ids)
    model = [s for s in trace.segments if s.kind == "model"]
    for i, seg in enumerate(model):
        sampled = tok.encode(seg.text, add_special_tokens=False) + (
            [tok.eos_token_id] if i == len(model) - 1 else []
        )
        res = await env.step(sampled)
        ids += sampled + res.observation_ids
        mask += [1] * len(sampled) + [0] * len(res.observation_ids)
    return ids, mask, res
