"""placement.plan is a pure function of the recipe: tested without a cluster, node by node."""

from __future__ import annotations

import sys

import pytest

from agent_rl import placement
from agent_rl.config import ConfigError
from agent_rl.errors import UserError

TWO_NODES = (
    "placement.nodes={engines: {cpus: 64, gpus: 8}, trainer: {cpus: 64, gpus: 8}}",
    "placement.engine={node: engines, gpus: 1, cpus: 4}",
    "placement.learner={node: trainer, gpus: 1, cpus: 4}",
    "placement.rollout={node: engines, cpus: 16}",
)


def test_one_machine_plan_needs_no_ray_and_applying_it_imports_none(smoke_recipe) -> None:
    p = placement.plan(*_parts(smoke_recipe()))
    assert not p.needs_ray and p.address is None and not p.engine_actors
    assert [(r.name, r.count) for r in p.roles] == [("learner", 1), ("engine", 1), ("rollout", 1)]
    had_ray = "ray" in sys.modules
    assert placement.apply(p) is False
    assert had_ray or "ray" not in sys.modules, "applying a Ray-free plan imported ray"


def test_resources_are_per_process_and_gpus_bring_ray_in(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "engines.count=4", "learner.dp=2", "placement.engine={gpus: 1}", "placement.learner={gpus: 2}"
    )
    p = placement.plan(*_parts(recipe))
    assert (p.role("engine").count, p.role("engine").gpus) == (4, 1.0)
    assert (p.role("learner").count, p.role("learner").gpus) == (2, 2.0)
    assert (
        p.needs_ray and p.address is None and p.engine_actors
    )  # GPUs are shared out by a local Ray instance
    assert p.role("engine").bundle() == {"CPU": 1.0, "GPU": 1.0}


def test_an_address_joins_a_cluster_and_the_cli_flag_wins_over_the_recipe(smoke_recipe) -> None:
    recipe = smoke_recipe("placement.address=ray://head:10001")
    assert (
        placement.plan(*_parts(recipe)).address == "ray://head:10001"
        and placement.plan(*_parts(recipe)).needs_ray
    )
    assert placement.plan(*_parts(recipe), "auto").address == "auto"


def test_megatron_model_parallel_groups_share_a_node_and_replicas_spread(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "learner.backend=megatron", "algorithm.opob_mode=exact", "learner.tp=4", "learner.sp=true", "learner.dp=2",
        "rollout.temperature=1.0",
        "engines.count=8", "engines.weight_sync=nccl", "placement.address=auto",
        "placement.nodes={engines: {cpus: 64, gpus: 8}, trainer: {count: 2, cpus: 8, gpus: 4}}",
        "placement.engine={node: engines, gpus: 1, cpus: 4}", "placement.learner={node: trainer, gpus: 1, cpus: 2}",
    )  # fmt: skip
    p = placement.plan(*_parts(recipe))
    assert p.role("learner").group == 4 and p.role("learner").bundle() == {
        "CPU": 2.0,
        "GPU": 1.0,
        "trainer": 0.001,
    }
    assert dict(p.layout) == {
        "engines-0": ("engine replica(s) 0-7 (4 CPU, 1 GPU each)",),
        "trainer-0": ("learner ranks 0-3 (model-parallel group 0) (2 CPU, 1 GPU each)",),
        "trainer-1": ("learner ranks 4-7 (model-parallel group 1) (2 CPU, 1 GPU each)",),
    }
    lines = p.describe()
    assert lines[0].startswith("node by node (each started with `ray start") and "node trainer-1:" in lines
    assert "anywhere with room: driver: rollout workers, buffer, the loop (1 CPU)" in lines


def test_dry_run_prints_the_two_node_layout_node_by_node(capsys, smoke_recipe, tiny_model_dir) -> None:
    from agent_rl.trainer import main_train

    sets = [f"model.path={tiny_model_dir}", "engines.count=8", "engines.weight_sync=nccl", "learner.dp=2",
            "placement.address=auto", *TWO_NODES]  # fmt: skip
    argv = ["recipes/tiny_tir_smoke.yaml", "--dry-run"] + [a for s in sets for a in ("--set", s)]
    assert main_train(argv) == 0
    out = capsys.readouterr().out
    engines_node = out.index("node engines-0:")
    trainer_node = out.index("node trainer-0:")
    assert engines_node < out.index("engine replica(s) 0-7 (4 CPU, 1 GPU each)") < trainer_node
    assert engines_node < out.index("driver: rollout workers, buffer, the loop (16 CPU)") < trainer_node
    assert trainer_node < out.index("learner ranks 0-1 (4 CPU, 1 GPU each)")


def test_roles_that_do_not_fit_their_nodes_are_refused_when_the_recipe_loads(smoke_recipe) -> None:
    with pytest.raises(
        ConfigError,
        match=r"the engines nodes \(1 x 8 gpus\) cannot hold 9 engine x 1 \+ 1 rollout x 0 = 9 gpus",
    ):
        smoke_recipe("engines.count=9", "engines.weight_sync=nccl", *TWO_NODES)
    with pytest.raises(ConfigError, match=r"placement.learner.node: 'gpus' is not in placement.nodes"):
        smoke_recipe("placement.learner={node: gpus}")
    with pytest.raises(ConfigError, match="model-parallel group of 4 ranks shares one node"):
        smoke_recipe(
            "learner.backend=megatron", "algorithm.opob_mode=exact", "learner.tp=4", "learner.dp=2",
            "placement.nodes={t: {count: 4, cpus: 8, gpus: 2}}",
            "placement.learner={node: t, gpus: 1}",
        )  # fmt: skip
    with pytest.raises(ConfigError, match="weight_sync: memory hands tensors over on one machine"):
        smoke_recipe("engines.count=2", *TWO_NODES)


def test_fragmented_nodes_fail_the_layout_naming_what_does_not_fit(smoke_recipe) -> None:
    # 2 nodes x 3 GPUs hold the 6 ranks' GPUs, but each takes one model-parallel group of 2 and keeps 1 GPU
    # over, so the third group finds no node with 2 free GPUs.
    recipe = smoke_recipe(
        "learner.backend=megatron", "algorithm.opob_mode=exact", "learner.tp=2", "learner.dp=3", "train.batch_prompts=3",
        "placement.nodes={t: {count: 2, cpus: 8, gpus: 3}}", "placement.learner={node: t, gpus: 1}",
    )  # fmt: skip
    with pytest.raises(UserError, match=r"learner ranks 4-5 .* do\(es\) not fit on any t node"):
        placement.plan(*_parts(recipe))


def _parts(recipe):
    """placement.plan takes the sub-configs it reads."""
    return recipe.engines, recipe.learner, recipe.placement
