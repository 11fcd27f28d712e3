"""Every shipped recipe validates, and its dry run builds the whole object graph.

GPU parts are replaced at their protocol boundary only: SGLang/vLLM clients are real objects
pointed at the recipe's urls (nothing is sent), and the learner is checked down to its
rank spec and vcpo step config without loading 7B weights.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

import envs
from agent_rl import hosts, placement
from agent_rl.cli import main
from agent_rl.config import load_recipe
from agent_rl.engines.client import SGLangClient, VLLMClient
from agent_rl.engines.pool import EnginePool
from agent_rl.learners.torch_learner import rank_spec
from agent_rl.loop_thread import LoopThread
from agent_rl.weight_sync import make_publisher

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
if (
    importlib.util.find_spec("verifiers") is None
):  # its own venv: tests/envs/test_verifiers_env.py trains it there
    RECIPES = [r for r in RECIPES if r.name != "verifiers_smoke.yaml"]
ENVS = sorted((ROOT / "envs").glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    """Stands in for the 7B models' tokenizers (not on disk here): the env graph only needs encode()."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_every_recipe_and_env_passes_validate_as_its_own_kind(capsys):
    # --skip-model: the GPU recipes' model.path is a placeholder to edit (/models/Qwen2.5-7B)
    assert RECIPES and ENVS
    assert main(["validate", "--skip-model", *map(str, RECIPES + ENVS)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (recipe)") == len(RECIPES)
    assert out.count(": ok (env)") == len(ENVS)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_dry_run_builds_the_graph_with_gpu_parts_at_their_protocol_boundary(
    path, shared_data, tiny_tokenizer, tmp_path
):
    recipe = load_recipe(path)
    plan = placement.plan(*_parts(recipe))
    assert plan.role("learner").count == recipe.learner.dp * recipe.learner.tp * recipe.learner.cp
    spec = envs.load(recipe.envs.train)
    env = envs.make(spec, tiny_tokenizer)
    assert env.tasks("train"), f"{path}: train split of {recipe.envs.train} is empty"
    for eval_env in recipe.envs.eval:
        assert envs.make(envs.load(eval_env), tiny_tokenizer).tasks(recipe.eval.split)
    if plan.layout:  # GPU recipes: every engine and learner rank lands on the node kind its role names
        for node, procs in plan.layout:
            kind = node.rsplit("-", 1)[0]
            for role, res in recipe.placement.roles().items():
                label = {"engine": "engine replica", "learner": "learner ranks", "rollout": "driver"}.get(
                    role, role
                )
                if any(p.startswith(label) for p in procs):
                    assert res.node == kind, f"{path}: {role} on {node}"
    if recipe.engines.type != "embedded":
        cls = SGLangClient if recipe.engines.type == "sglang" else VLLMClient
        if recipe.engines.urls:  # the engines as train() starts them for external servers: one client per url
            engines = asyncio.run(
                hosts.start_engines(plan, recipe.engines, recipe.model, seed=recipe.train.seed)
            )
            pool = engines.client
            assert isinstance(pool, EnginePool) and all(type(m.engine) is cls for m in pool.members)
            assert [m.engine.url for m in pool.members] == [u.rstrip("/") for u in recipe.engines.urls]
            assert plan.role("engine").count == 0, "external servers are not placed by the run"
        else:  # Ray starts the servers: every replica is placed by the plan, on a node of the engine's kind
            assert plan.role("engine").count == recipe.engines.started_here >= 1
            assert plan.engine_actors, f"{path}: engine servers not started as Ray actors"
            pool = EnginePool([cls(f"http://127.0.0.1:{30000 + i}") for i in range(recipe.engines.count)])
        loop = LoopThread()
        try:  # the weight path is built as train() builds it: a wrong mode/engine pairing fails here
            make_publisher(recipe.engines, recipe.rollout.fixed_lag, pool, loop, scratch=tmp_path)
        finally:
            loop.close()
    spec = rank_spec(recipe.learner_spec)  # checks the loss/advantage pairing the learner would run
    assert spec.step.loss == recipe.algorithm.loss and spec.lr == recipe.learner.lr
    if recipe.learner.backend == "megatron":
        assert recipe.learner.tp > 1 and recipe.learner.sp  # the GPU recipes shard over TP with SP


def _parts(recipe):
    """placement.plan takes the sub-configs it reads."""
    return recipe.engines, recipe.learner, recipe.placement
