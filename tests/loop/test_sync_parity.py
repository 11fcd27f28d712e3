"""Parity: at k=0 the async machinery (buffer, admission, rollout workers, weight sync) gives the same update as a
plain generate-then-train loop written out below, on the same prompts and sampling seeds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from loop_paths import DENSE_ENV
from safetensors.torch import load_file
from transformers import AutoTokenizer

import envs
from agent_rl import checkpoint
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


def test_sync_k0_update_equals_a_plain_generate_then_train_loop(smoke_recipe, tmp_path: Path) -> None:
    recipe = smoke_recipe(
        f"envs.train={DENSE_ENV}",  # rewards that differ within a group, so the step moves the weights
        "buffer.max_staleness=0",
        "train.steps=1",
        "checkpoint.every=1",
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
    assert [t.num_sampled for g in groups for t in g.trajectories] == record["sampled_tokens"], (
        "same episodes"
    )
    learner = build_learner(recipe.learner_spec)
    try:
        learner.step(groups)
        plain = learner.hf_state_dict()
    finally:
        learner.close()
    trained = load_file(str(checkpoint.latest(run_dir) / "hf" / "model.safetensors"))
    start = load_file(str(Path(recipe.model.path) / "model.safetensors"))
    moved = 0.0
    for name, w in trained.items():
        diff = (plain[name].float() - w.float()).abs().max().item()
        assert diff < 1e-5, f"{name}: max |diff| {diff:.3g}"
        moved = max(moved, (w.float() - start[name].float()).abs().max().item())
    # Adam's first step moves a weight by up to lr = 1e-4: a 1e-5 bound separates float noise from another update
    assert moved > 5e-5, "the step changed the weights (otherwise equality would prove nothing)"
