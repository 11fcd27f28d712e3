"""Fixtures for the teacher tests: reference log-probs of a plain transformers forward, in fp32 and float64."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def reference_logprobs(tiny_model_dir):
    """reference_logprobs(ids, start) -> (fp32, float64) log p(ids[t] | ids[:t]) for t >= start, from uncached
    transformers forwards of the tiny model in both precisions."""
    from transformers import AutoModelForCausalLM

    models = {
        dt: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dt).eval()
        for dt in (torch.float32, torch.float64)
    }

    def compute(ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for model in models.values():
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0]
            lp = torch.log_softmax(logits[start - 1 : -1], dim=-1)
            out.append(lp.gather(-1, torch.tensor(ids[start:])[:, None])[:, 0].double())
        return out[0], out[1]

    return compute
