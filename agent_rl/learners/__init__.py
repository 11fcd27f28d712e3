"""Learners: the torch learner (default) and the Megatron learner, behind one protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from agent_rl.config import Recipe
    from agent_rl.types import Group


class Learner(Protocol):
    """What the training loop needs from a learner, whatever runs it (torch DDP, Megatron TP/SP/CP)."""

    version: int
    """Policy version of the current weights; +1 after every optimizer step."""

    def step(self, groups: Sequence[Group]) -> Mapping[str, float]:
        """One optimizer update on whole groups (the global batch); returns finite metrics."""
        ...

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (gathered) weights under Hugging Face names, for engine weight sync and saving."""
        ...

    def save(self, path: Path) -> None:
        """Model, optimizer, lr schedule, RNG, version: everything needed to resume."""
        ...

    def load(self, path: Path) -> None: ...

    def close(self) -> None:
        """Stop rank processes / actors this learner started."""
        ...


def build(recipe: Recipe) -> Learner:
    """The learner `recipe.learner.backend` names; heavy backends are imported only here."""
    if recipe.learner.backend == "megatron":
        from agent_rl.learners.megatron import build_megatron_learner

        return build_megatron_learner(recipe)
    from agent_rl.learners.torch_learner import build_learner

    return build_learner(recipe)
