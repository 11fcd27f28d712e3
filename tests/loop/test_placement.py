"""placement.plan is a pure function of the recipe: tested without a cluster."""

from __future__ import annotations

import sys

from agent_rl import placement


def test_one_machine_plan_needs_no_ray_and_applying_it_imports_none(smoke_recipe) -> None:
    p = placement.plan(*_parts(smoke_recipe()))
    assert not p.needs_ray and p.address is None
    assert [(r.name, r.count) for r in p.roles] == [("learner", 1), ("engine", 1), ("rollout", 1)]
    had_ray = "ray" in sys.modules
    assert placement.apply(p) is False
    assert had_ray or "ray" not in sys.modules, "applying a Ray-free plan imported ray"


def test_replicas_ranks_and_gpus_are_split_per_role(smoke_recipe) -> None:
    recipe = smoke_recipe(
        "engines.count=4", "learner.dp=2", "placement.engine_gpus=4", "placement.learner_gpus=2"
    )
    p = placement.plan(*_parts(recipe))
    assert (p.role("engine").count, p.role("engine").gpus) == (4, 1.0)
    assert (p.role("learner").count, p.role("learner").gpus) == (2, 1.0)
    assert not p.needs_ray  # replicas and ranks are local processes on one machine


def test_an_address_joins_a_cluster_and_the_cli_flag_wins_over_the_recipe(smoke_recipe) -> None:
    recipe = smoke_recipe("placement.address=ray://head:10001")
    assert (
        placement.plan(*_parts(recipe)).address == "ray://head:10001"
        and placement.plan(*_parts(recipe)).needs_ray
    )
    assert placement.plan(*_parts(recipe), "auto").address == "auto"


def _parts(recipe):
    """placement.plan takes the sub-configs it reads."""
    return recipe.engines, recipe.learner, recipe.placement
