"""The framework cookbooks (examples/{agents_sdk,langgraph,pydantic_ai,smolagents}_agent) trained by `agent-rl
train` for 2 steps each on the tool model, through the recording gateway: each framework's real package runs
the episodes, every step trains, and every trained token is one the engine sampled (log-prob and version)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {
    "agents_sdk": "agents",
    "langgraph": "langgraph",
    "pydantic_ai": "pydantic_ai",
    "smolagents": "smolagents",
}


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_cookbook_smoke_recipe_trains(framework, tool_model, tmp_path):
    pytest.importorskip(FRAMEWORKS[framework])
    from agent_rl.config import load_recipe
    from agent_rl.trainer import train
    from agent_rl.viewer.log import read_index, read_step

    recipe = load_recipe(
        ROOT / "recipes" / "cookbooks" / f"{framework}_smoke.yaml",
        [f"model.path={tool_model}", f"logging.run_dir={tmp_path / 'run'}"],
    )
    run_dir = train(recipe)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1] and records[-1]["learner/version"] == 2
    assert all(math.isfinite(r["rollout/reward_mean"]) for r in records)
    assert (
        records[0]["rollout/agent_calls_per_episode"] >= 1
    )  # per step's interval: absent when no episode ended in it
    # the embedded engine reports unmasked log-probs for constrained calls: none falls back to the masked ones
    assert records[-1]["rollout/constrained_masked_fallback_tokens"] == 0
    for summary in read_index(run_dir):
        for t in read_step(run_dir, summary.step).trajectories:
            sampled = [s for s in t.segments if s.sampled]
            assert sampled and all(
                len(s.behavior_logprobs) == len(s.token_ids) == len(s.versions) for s in sampled
            )
            assert all(math.isfinite(x) and x <= 0 for s in sampled for x in s.behavior_logprobs)
            assert max(t.versions) <= summary.learner_version


def test_a_cookbook_trains_through_sglangs_api_on_masked_logprobs_and_counts_them(tool_model, tmp_path):
    """smolagents' tool agent (tool_choice "required": every call constrained) trained for 2 steps against an
    engine that reports no unmasked log-probs, as SGLang: the embedded engine's server speaking SGLang's native
    API to the real SGLangClient (`engines.type: sglang` with its url). Every episode closes and trains on the
    masked log-probs, and `rollout/constrained_masked_fallback_tokens` counts them."""
    pytest.importorskip("smolagents")
    from agent_rl.config import load_recipe
    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.launch import launch_embedded
    from agent_rl.trainer import train
    from agent_rl.viewer.log import read_index, read_step

    server = launch_embedded(str(tool_model), EngineOptions(max_batch=16, max_seq_len=1024), threads=1)
    try:
        recipe = load_recipe(
            ROOT / "recipes" / "cookbooks" / "smolagents_smoke.yaml",
            [
                f"model.path={tool_model}",
                f"logging.run_dir={tmp_path / 'run'}",
                "engines.type=sglang",
                f"engines.urls=[{server.url}]",
            ],
        )
        run_dir = train(recipe)
    finally:
        server.stop()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1] and records[-1]["learner/version"] == 2
    # smolagents' last call after max_steps (its final answer) is unconstrained: not every token is counted
    assert records[-1]["rollout/constrained_masked_fallback_tokens"] > 0
    for summary in read_index(run_dir):
        trajectories = read_step(run_dir, summary.step).trajectories
        assert trajectories
        for t in trajectories:
            sampled = [s for s in t.segments if s.sampled]
            assert sampled and all(len(s.behavior_logprobs) == len(s.token_ids) for s in sampled)
            assert all(math.isfinite(x) and x <= 0 for s in sampled for x in s.behavior_logprobs)
