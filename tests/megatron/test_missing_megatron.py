"""Choosing learner.backend: megatron without megatron-core installed says what to install."""

from __future__ import annotations

import sys

import pytest

from agent_rl.config import Recipe
from agent_rl.learners import build
from agent_rl.learners.megatron import MegatronNotInstalled


def test_megatron_backend_without_megatron_core_names_the_extra(monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "megatron", None)  # import megatron -> ImportError, installed or not
    recipe = Recipe.model_validate(
        {
            "name": "m",
            "model": {"path": str(tmp_path)},
            "envs": {"train": "x.yaml"},
            "train": {"steps": 1, "batch_prompts": 1},
            "learner": {"backend": "megatron", "tp": 2, "sp": True},
        }
    )
    with pytest.raises(MegatronNotInstalled, match=r"pip install 'agent-rl\[gpu\]'.*megatron-core"):
        build(recipe.learner_spec)
