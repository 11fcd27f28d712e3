"""Fixtures for the engine tests: the HF reference model, an in-process engine, and one HTTP server per session."""

from __future__ import annotations

import pytest
import torch

from agent_rl.engines.api import EngineOptions
from agent_rl.engines.embedded.engine import EmbeddedEngine


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture
async def engine(tiny_model_dir):
    eng = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=8, max_seq_len=256), seed=0)
    yield eng
    await eng.close()


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    from agent_rl.engines.launch import launch_embedded

    handle = launch_embedded(str(tiny_model_dir), EngineOptions(max_batch=64, max_seq_len=512), threads=1)
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def hf_logprobs(hf_model):
    """log_softmax of a plain (uncached) transformers forward pass at each output token: hf_logprobs(prompt, output)."""

    def compute(prompt: list[int], output: list[int], model=None) -> torch.Tensor:
        with torch.no_grad():
            logits = (model or hf_model)(torch.tensor([prompt + output])).logits[0].float()
        lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        return lp.gather(-1, torch.tensor(output)[:, None])[:, 0]

    return compute
