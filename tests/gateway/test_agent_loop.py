"""Agent envs in the rollout loop: the example agent through the gateway with a weight update landing
mid-episode (token identity, per-token versions), an agent that rewrites history (splits delivered with the
group, sharing its reward), and `agent-rl train` of the example agent for a few steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from recorder import Recorder

import envs
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.engines.api import EngineOptions
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.rollout.workers import PromptSource, Rollouts

pytest.importorskip("openai")
DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


async def run_rollouts(spec, model_dir, engine_client, *, groups: int):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    sandbox = envs.make_sandbox(spec)
    buffer = RolloutBuffer(BufferConfig(max_staleness=2), batch_prompts=groups, group_size=spec.group_size)
    rollouts = Rollouts(
        # one group's episodes at a time: the first second call (where the update lands) is the first group's
        RolloutConfig(temperature=0.05, max_concurrent_episodes=spec.group_size),
        buffer,
        PromptSource(envs.make(spec, tok, sandbox).tasks("train"), seed=0),
        lambda: envs.make(spec, tok, sandbox),
        engine_client,
        max_seq_len=512,
        seed=0,
    )
    rollouts.start()
    try:
        taken = await buffer.take(groups)
    finally:
        await rollouts.stop()
        await sandbox.close()
    return taken, rollouts


async def test_example_agent_keeps_token_identity_and_versions_across_a_mid_episode_weight_update(tool_model):
    spec = envs.load(DATA / "example_agent.yaml")
    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=8, max_seq_len=512), seed=0)
    # the update lands in the middle of an episode's second chat completion (after its tool ran)
    rec = Recorder(engine, when=lambda rid: rid.split("/")[1].startswith("1."), after=2)
    try:
        (group,), rollouts = await run_rollouts(spec, tool_model, rec, groups=1)
    finally:
        await engine.close()
    assert rec.updated.is_set()
    for traj in group.trajectories:
        assert traj.finish_reason is not None and traj.reward is not None
        calls = rec.per_call(traj.uid.replace("/", "-"))
        sampled = [s for s in traj.segments if s.sampled]
        # every sampled token is exactly what the engine returned, with its log-prob and version
        assert [list(s.token_ids) for s in sampled] == [c[0] for c in calls]
        assert [list(s.logprobs) for s in sampled] == [c[1] for c in calls]
        assert [list(s.versions) for s in sampled] == [c[2] for c in calls]
    spanning = [t for t in group.trajectories if t.min_version != t.max_version]
    assert spanning  # interrupted mid-episode, continued under the new weights, ended normally
    target = rec.target.split("/")[0]  # the session whose second call the update landed in (by event)
    assert target in {t.uid.replace("/", "-") for t in spanning}
    for traj in spanning:
        assert traj.min_version == 0 and traj.max_version == 1
        assert traj.turns[0].code_ran  # the agent ran its python tool between the two calls
        second = [s for s in traj.segments if s.sampled][-1]
        if traj.uid.replace("/", "-") == target:  # interrupted mid-call, continued under the new weights
            assert [turn.aborts for turn in traj.turns] == [0, 1] and second.versions[0] == 0
        elif traj.turns[1].aborts == 0:  # other episodes may start their second call only after the update
            assert set(second.versions) == {1}
    assert rollouts.counters.agent_calls >= 2 * len(group.trajectories) - 1
    assert rollouts.counters.agent_splits == 0 and rollouts.counters.errors == 0


async def test_agent_that_rewrites_history_splits_and_the_forks_share_the_episode_reward(tiny_model_dir):
    spec = envs.load(DATA / "rewriting_agent.yaml")
    engine = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=8, max_seq_len=512), seed=0)
    try:
        (group,), rollouts = await run_rollouts(spec, tiny_model_dir, engine, groups=1)
    finally:
        await engine.close()
    members = [t for t in group.trajectories if "." not in t.uid.rsplit("/", 1)[1]]
    forks = [t for t in group.trajectories if t not in members]
    assert len(members) == spec.group_size and len(forks) == spec.group_size
    for f in forks:
        member = next(m for m in members if f.uid.startswith(m.uid + "."))
        assert f.reward == member.reward == 0.5 and f.group_id == member.group_id
        assert f.prompt_ids != member.prompt_ids[: len(f.prompt_ids)]
    assert rollouts.counters.agent_splits == spec.group_size
    stats = rollouts.stats()
    assert stats["rollout/agent_splits"] == spec.group_size and stats["rollout/agent_calls_per_episode"] == 2


def test_agent_rl_train_runs_the_example_agent_through_the_async_loop(tool_model, tmp_path):
    from agent_rl.config import load_recipe
    from agent_rl.trainer import train

    recipe = load_recipe(
        ROOT / "recipes" / "agent_arith_smoke.yaml",
        [f"model.path={tool_model}", f"logging.run_dir={tmp_path / 'run'}"],
    )
    run_dir = train(recipe)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(recipe.train.steps))
    assert records[-1]["learner/version"] == recipe.train.steps
    for r in records:
        assert math.isfinite(r["rollout/reward_mean"]) and "rollout/agent_splits" in r
    # Per-episode rates cover the episodes that ended during the step; at k=2 the last steps' batches may
    # all have been sampled earlier (none ended: no rate is written), so check the steps where some did.
    ended = [r for r in records if "rollout/episode_seconds" in r]
    assert ended and all(r["rollout/agent_calls_per_episode"] >= 1 for r in ended)


async def test_agent_that_raises_after_a_reply_cut_by_its_token_budget_scores_zero_not_an_error(tool_model):
    spec = envs.load(DATA / "give_up_agent.yaml")
    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=8, max_seq_len=512), seed=0)
    try:
        (group,), rollouts = await run_rollouts(spec, tool_model, engine, groups=1)
    finally:
        await engine.close()
    assert rollouts.counters.errors == rollouts.counters.agent_errors == 0
    for traj in group.trajectories:
        assert traj.finish_reason.value == "length" and traj.reward == 0.0 and len(traj.response_ids) == 4
