"""Engine vs Hugging Face forward on each supported family (Qwen3, Qwen2, Llama), fp32 and bf16.

The log-prob the engine reports for every sampled token must be the log-softmax that a plain (uncached)
transformers forward of the same dtype computes for it: this is the behaviour log-prob the learner's
importance weights divide by. A batch of prompts of different lengths runs together (prefill + decode
over packed slots, the prefix cache on a repeated prompt), rendered with the family's chat template.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.openai import chat

# Same math in another op order: fp32 agrees to float rounding; bf16 rounds every activation to 8 bits
# of mantissa, so kernels that sum in a different order (fused addmm, oneDNN) move log-probs by ~1e-2.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05}
MESSAGES = [
    [{"role": "user", "content": "What is 3 * 4?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}],
    [{"role": "user", "content": "Hi"}],
]


def hf_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture(scope="module")
def rendered(family_dir):
    """family -> the MESSAGES rendered with its template (tokenizers load once per family)."""
    from transformers import AutoTokenizer

    out: dict[str, list[list[int]]] = {}

    def get(family: str) -> list[list[int]]:
        if family not in out:
            tok = AutoTokenizer.from_pretrained(family_dir(family))
            out[family] = [chat.render(tok, m, None) for m in MESSAGES]
        return out[family]

    return get


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
async def test_engine_logprobs_equal_hf_forward(family, dtype, family_dir, rendered):
    from transformers import AutoModelForCausalLM

    model_dir = family_dir(family)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    prompts = list(rendered(family))
    prompts.append(prompts[0])  # the same prompt again: served from the cached prefix of a slot
    eng = EmbeddedEngine(
        model_dir,
        EngineOptions(max_batch=4, max_seq_len=256, dtype=dtype),
    )
    try:
        gens = await asyncio.gather(
            *(
                eng.generate(
                    p, SamplingParams(max_new_tokens=12 + 4 * i, ignore_eos=True, seed=i), request_id=str(i)
                )
                for i, p in enumerate(prompts[:3])
            )
        )
        gens.append(
            await eng.generate(
                prompts[3], SamplingParams(max_new_tokens=8, ignore_eos=True, seed=9), request_id="again"
            )
        )
    finally:
        await eng.close()
    worst = 0.0
    for p, g in zip(prompts, gens, strict=True):
        assert len(g.token_ids) == len(g.logprobs) > 0
        worst = max(worst, (hf_logprobs(hf, p, g.token_ids) - torch.tensor(g.logprobs)).abs().max().item())
    assert worst <= TOLERANCE[dtype], (family, dtype, worst)
