"""Learners behind `api.Learner`: the torch learner (default) and the Megatron learner; `build` picks one.
Heavy backends are imported only inside `build`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_rl.config import LearnerSpec
    from agent_rl.learners.api import Learner


def build(spec: LearnerSpec, rank_cores: tuple[tuple[int, ...], ...] | None = None) -> Learner:
    """The learner `spec.learner.backend` names (`Recipe.learner_spec`); heavy backends are imported only here.
    `rank_cores` (placement.topology: processes): every rank runs in a process of its own, pinned to its cores."""
    if spec.learner.backend == "megatron":
        from agent_rl.learners.megatron import build_megatron_learner

        return build_megatron_learner(spec, rank_cores=rank_cores)
    from agent_rl.learners.torch_learner import build_learner

    return build_learner(spec, rank_cores=rank_cores)
