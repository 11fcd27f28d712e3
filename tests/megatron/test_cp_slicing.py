"""Sequence lengths under the parallel layouts (pure tensor code; the context-parallel forward itself is tested in
test_attention.py, each CP rank's chunks in test_packing.py), and context parallelism's one config rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_rl.config import ConfigError, load_recipe
from agent_rl.learners.megatron.logprobs import pad_to_multiple
from agent_rl.learners.megatron.model import ParallelConfig

GOOD = Path(__file__).resolve().parents[1] / "data" / "recipes" / "good.yaml"


def test_sequences_pad_to_what_sp_and_cp_split():
    assert ParallelConfig(tp=4, sp=True, cp=2).seq_multiple == 16
    assert ParallelConfig(tp=4, sp=False).seq_multiple == 1
    assert pad_to_multiple(torch.ones(1, 13, dtype=torch.long), 4).tolist() == [[1] * 13 + [0] * 3]


def test_context_parallelism_refuses_unpacked_rows_when_the_recipe_loads():
    sets = ["learner.backend=megatron", "learner.cp=2", "learner.pack_sequences=false"]
    with pytest.raises(ConfigError, match="pack_sequences: false with learner.cp > 1"):
        load_recipe(GOOD, sets)
    load_recipe(GOOD, sets[:2])  # packed (the default) is fine
