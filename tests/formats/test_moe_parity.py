"""The embedded engine on the MoE and hybrid checkpoints (Qwen3-MoE, Qwen3-Next, Qwen3.5, Qwen3.5-MoE) vs transformers.

- Log-probs: every sampled token's log-prob equals the log-softmax of a plain (uncached) transformers
  forward, fp32, within 1e-4. Both sides compute the same math in another order (fused GEMMs, experts
  summed in sorted order, the chunked vs the token-by-token delta rule): fp32 rounding (~6e-8 relative)
  accumulated over a few hundred-term sums and four layers stays near 1e-6; 1e-4 is the bound the dense
  families use. In bf16 a near-tie of two router probabilities can flip an expert between two kernel
  orders, so bf16 is compared with the learner's routing replayed instead (test_moe_replay.py).
- Greedy decoding writes the tokens transformers' `generate` writes.
- The routing the engine reports for every fed position is the top-k transformers' router picks for that
  token (as sets: the order within the top-k is the score order), and a per-expert checkpoint (the hub
  layout) loads as the fused one does.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from sparse_models import ARCHS, HYBRID_ARCHS, MOE_ARCHS

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.loader import load_model

FP32_TOLERANCE = 1e-4
# token ids of three prompts of different lengths (the checkpoints have no tokenizer: sparse_models.py)
PROMPTS = [
    [11, 873, 42, 1999, 7, 3051, 260, 18, 4000, 19, 30, 512, 77, 2048, 9],
    [3, 1500, 2201, 99, 64, 3333, 871, 12, 1024],
    [2500, 6, 140, 2990],
]


def hf_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


async def sample_all(model_dir, dtype: str, prompts, **sp) -> list:
    """One engine, the prompts together (continuous batching), then the first prompt again (prefix cache)."""
    eng = EmbeddedEngine(model_dir, EngineOptions(max_batch=4, max_seq_len=256, dtype=dtype))
    try:
        gens = await asyncio.gather(
            *(
                eng.generate(
                    p,
                    SamplingParams(max_new_tokens=10 + 4 * i, ignore_eos=True, seed=i, **sp),
                    request_id=str(i),
                )
                for i, p in enumerate(prompts)
            )
        )
        gens.append(
            await eng.generate(
                prompts[0],
                SamplingParams(max_new_tokens=8, ignore_eos=True, seed=9, **sp),
                request_id="again",
            )
        )
    finally:
        await eng.close()
    return gens


@pytest.mark.parametrize("arch", ARCHS)
async def test_engine_logprobs_equal_hf_forward_fp32(arch, sparse_dir, hf_of):
    model_dir = sparse_dir(arch)
    hf, prompts = hf_of(model_dir), PROMPTS
    gens = await sample_all(model_dir, "float32", prompts)
    worst = 0.0
    for p, g in zip([*prompts, prompts[0]], gens, strict=True):
        assert len(g.token_ids) == len(g.logprobs) > 0
        worst = max(worst, (hf_logprobs(hf, p, g.token_ids) - torch.tensor(g.logprobs)).abs().max().item())
    assert worst <= FP32_TOLERANCE, (arch, worst)


@pytest.mark.parametrize("arch", ARCHS)
async def test_greedy_generation_equals_hf_generate(arch, sparse_dir, hf_of):
    model_dir = sparse_dir(arch)
    hf, prompts = hf_of(model_dir), PROMPTS
    gens = await sample_all(model_dir, "float32", prompts, temperature=0.0)
    for p, g in zip([*prompts, prompts[0]], gens, strict=True):
        n = len(g.token_ids)
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[
                0, len(p) :
            ]
        assert g.token_ids == want.tolist(), arch


@pytest.mark.parametrize("arch", MOE_ARCHS)
async def test_reported_routing_is_hf_router_topk(arch, sparse_dir, hf_of):
    """Every fed position (prompt, then each sampled token but the last), every sparse layer: the same experts."""
    model_dir = sparse_dir(arch)
    hf, prompts = hf_of(model_dir), PROMPTS
    gens = await sample_all(model_dir, "float32", prompts, return_routed_experts=True)
    k = hf.config.num_experts_per_tok
    for p, g in zip([*prompts, prompts[0]], gens, strict=True):
        routes = g.routed_experts
        layers = hf.config.num_hidden_layers
        assert routes is not None and routes.width == layers * k
        n = len(p) + len(g.token_ids) - 1
        assert routes.positions == n
        got = torch.tensor(routes.ids).view(n, layers, k)
        with torch.no_grad():
            out = hf(torch.tensor([p + g.token_ids[:-1]]), output_router_logits=True)
        sparse = [i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "experts")]
        assert len(out.router_logits) == len(sparse) > 0
        for i, logits in zip(sparse, out.router_logits, strict=True):
            want = logits.softmax(-1).topk(k, dim=-1).indices  # [n, k]
            assert torch.equal(got[:, i].sort(-1).values, want.sort(-1).values.to(got.dtype)), (arch, i)
        dense = [i for i in range(layers) if i not in sparse]
        assert all(bool((got[:, i] == -1).all()) for i in dense)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
def test_fused_expert_tensors_load_like_the_per_expert_checkpoint(arch, sparse_dir, hf_of, tmp_path):
    """What a learner's state_dict() holds (transformers' fused [E, 2I, H] experts) is what the hub layout means."""
    from safetensors.torch import save_file

    model_dir = sparse_dir(arch)
    per_expert = load_model(model_dir)
    hf = hf_of(model_dir)
    state = {n: t.contiguous() for n, t in hf.state_dict().items()}
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in state)  # transformers' in-memory names
    fused_dir = tmp_path / "fused"
    fused_dir.mkdir()
    for f in model_dir.iterdir():
        if f.suffix == ".json":
            (fused_dir / f.name).write_bytes(f.read_bytes())
    save_file(state, str(fused_dir / "model.safetensors"))
    fused = load_model(fused_dir)
    a, b = dict(per_expert.named_parameters()), dict(fused.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_weight_of_the_sparse_models_is_random(arch, sparse_dir):
    """No tensor is constant: transformers initialises norm scales, dt_bias and biases to constants, and a parity
    test on a constant one cannot tell a swapped or dropped one (sparse_models.randomise_constants draws them)."""
    from safetensors.torch import load_file

    state = load_file(str(sparse_dir(arch) / "model.safetensors"))
    constant = [n for n, t in state.items() if t.numel() > 1 and bool((t == t.flatten()[0]).all())]
    assert not constant, (arch, constant)
    assert any(n.endswith("norm.weight") for n in state)
    assert any(n.endswith("dt_bias") for n in state) == (arch in HYBRID_ARCHS)  # DeltaNet's, drawn too
