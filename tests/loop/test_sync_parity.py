"""Parity: at k=0 the async machinery (buffer, admission, rollout workers, weight sync) trains on the same batch,
and its learner computes the same policy-gradient coefficients from it, as a plain generate-then-train loop written
out below, on the same prompts and sampling seeds (compared as tests/loop/parity.py says: not weights after Adam)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from loop_paths import DENSE_ENV
from parity import assert_same_step, recorded_step, seen
from transformers import AutoTokenizer

import envs
from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.learners import build as build_learner
from agent_rl.rollout.workers import _seed
from agent_rl.trainer import train
from agent_rl.types import FinishReason, Group, Trajectory, TurnInfo


async def _plain_episode(engine, env, task, uid: str, recipe) -> Trajectory:
    """One episode, turn after turn: generate until the stop string, step the env, append its tokens."""
    traj = Trajectory(uid=uid, group_id=uid.rsplit("/", 1)[0], prompt_ids=env.reset(task), task_id=task.id)
    while True:
        room = recipe.engines.max_seq_len - len(traj)
        sampling = SamplingParams(
            max_new_tokens=min(env.max_new_tokens, room),
            stop=tuple(env.stop_strings),
            seed=_seed(recipe.train.seed, uid, len(traj.turns), 0),
        )
        gen = await engine.generate(traj.prompt_ids + traj.response_ids, sampling, request_id=uid)
        traj.append_sampled(gen.token_ids, gen.logprobs, list(gen.versions))
        result = await env.step(gen.token_ids, truncated=gen.finish_reason != "stop")
        traj.turns.append(TurnInfo(sampled_tokens=len(gen.token_ids), env_tokens=len(result.observation_ids)))
        traj.append_env(result.observation_ids)
        if result.done:
            traj.reward = float(result.reward or 0.0)
            traj.finish_reason = FinishReason(result.info.finish or "length")
            traj.masked = result.info.masked
            return traj


async def _plain_batch(recipe, uids_by_task: dict[str, list[str]]) -> list[Group]:
    spec = envs.load(recipe.envs.train)
    tokenizer = AutoTokenizer.from_pretrained(recipe.model.path)
    sandbox = envs.make_sandbox(spec)
    engine = EmbeddedEngine(
        recipe.model.path, EngineOptions(max_batch=8, max_seq_len=recipe.engines.max_seq_len), seed=0
    )
    tasks = {t.id: t for t in envs.make(spec, tokenizer, sandbox).tasks("train")}
    groups = []
    try:
        for task_id, uids in uids_by_task.items():
            members = []
            for uid in uids:  # one at a time: nothing overlaps, nothing is stale
                env = envs.make(spec, tokenizer, sandbox)
                members.append(await _plain_episode(engine, env, tasks[task_id], uid, recipe))
                await env.close()
            groups.append(Group(members[0].group_id, members))
    finally:
        await engine.close()
        await sandbox.close()
    return groups


def test_sync_k0_trains_on_what_a_plain_generate_then_train_loop_makes(smoke_recipe) -> None:
    recipe = smoke_recipe(
        f"envs.train={DENSE_ENV}",  # rewards that differ within a group, so the advantages are not all 0
        "buffer.max_staleness=0",
        "train.steps=1",
        "checkpoint.every=0",
        "logging.trajectories=all",  # every trained trajectory with the learner's log-probs and coefficients
    )
    run_dir = Path(train(recipe))
    (record,) = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert all(runs == [[0, runs[0][1]]] for runs in record["versions"]), (
        "k=0: every token sampled by version 0"
    )
    uids_by_task: dict[str, list[str]] = {}
    for uid in record["uids"]:
        task_id = record["tasks"][record["uids"].index(uid) // (len(record["uids"]) // len(record["tasks"]))]
        uids_by_task.setdefault(task_id, []).append(uid)

    groups = asyncio.run(_plain_batch(recipe, uids_by_task))
    learner = build_learner(recipe.learner_spec)
    try:
        learner.step(groups)
        plain = seen((t for g in groups for t in g.trajectories), learner.trained_rows())
    finally:
        learner.close()
    ran = recorded_step(run_dir, 0)
    assert any(abs(x.advantage) > 0.05 for x in ran.values()), "a step with every advantage 0 proves nothing"
    assert_same_step(ran, plain)
