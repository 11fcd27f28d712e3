"""Loop test helpers: the smoke recipe pointed at the session's tiny model and a private run dir."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from loop_paths import HERE, ROOT

from agent_rl.config import Recipe, load_recipe

if str(HERE) not in sys.path:  # dense_reward.py, imported by the dense env's callable reward
    sys.path.insert(0, str(HERE))


@pytest.fixture
def smoke_recipe(tiny_model_dir: Path, tmp_path: Path) -> Callable[..., Recipe]:
    """recipes/tiny_tir_smoke.yaml with the tiny model, a tmp run dir and `--set`-style overrides."""

    def make(*overrides: str) -> Recipe:
        base = [f"model.path={tiny_model_dir}", f"logging.run_dir={tmp_path / 'run'}"]
        return load_recipe(ROOT / "recipes" / "tiny_tir_smoke.yaml", base + list(overrides))

    return make
