"""Shared fixtures: a tiny real Hugging Face model directory built offline once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen2ForCausalLM (hidden 128, untied embeddings) and its BPE tokenizer, saved to disk."""
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    return build_tiny(tmp_path_factory.mktemp("tiny_model"), sample_corpus(), vocab_size=512, seed=0)


@pytest.fixture(scope="session")
def tool_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model over-fitted to one Hermes function-calling round trip (tests/tool_model.py)."""
    import torch
    from tool_model import build_tool_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_tool_model(tiny_model_dir, tmp_path_factory.mktemp("tool_model"))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout (the data sets with their SOURCE.txt)."""
    path = SHARED / "data"
    if not path.is_dir():
        pytest.skip(f"{path} not found: the tests expect ../shared beside the checkout")
    return path
