"""The embedded engine computes what transformers computes: log-probs, greedy tokens, sampling filters."""

from __future__ import annotations

import asyncio

import torch
from float_bounds import TINY_LOGPROB_ATOL, drift

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.sampling import filtered_logprobs

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27], [40]]


async def test_logprobs_equal_transformers_forward_batch_1(engine, hf_logprobs):
    g = await engine.generate(
        PROMPTS[0], SamplingParams(max_new_tokens=24, ignore_eos=True, seed=3), request_id="a"
    )
    assert len(g.token_ids) == 24
    diff = (hf_logprobs(PROMPTS[0], g.token_ids) - torch.tensor(g.logprobs)).abs().max().item()
    assert diff <= TINY_LOGPROB_ATOL, diff  # float32, two code paths: tests/float_bounds.py


async def test_logprobs_equal_transformers_forward_mixed_length_batch(engine, hf_logprobs):
    # Different prompt lengths and output lengths share prefill and decode batches.
    params = [
        SamplingParams(max_new_tokens=n, ignore_eos=True, seed=i) for i, n in enumerate([30, 7, 19, 25])
    ]
    gens = await asyncio.gather(
        *(
            engine.generate(p, s, request_id=f"r{i}")
            for i, (p, s) in enumerate(zip(PROMPTS, params, strict=True))
        )
    )
    for p, s, g in zip(PROMPTS, params, gens, strict=True):
        assert len(g.token_ids) == s.max_new_tokens and g.finish_reason == "length"
        diff = (hf_logprobs(p, g.token_ids) - torch.tensor(g.logprobs)).abs().max().item()
        assert diff <= TINY_LOGPROB_ATOL, (p, diff)


async def test_greedy_equals_transformers_generate_greedy(engine, hf_model):
    gens = await asyncio.gather(
        *(
            engine.generate(
                p, SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True), request_id=str(i)
            )
            for i, p in enumerate(PROMPTS)
        )
    )
    for p, g in zip(PROMPTS, gens, strict=True):
        ref = hf_model.generate(torch.tensor([p]), max_new_tokens=40, do_sample=False, eos_token_id=None)
        assert g.token_ids == ref[0, len(p) :].tolist()


async def test_bfloat16_logprobs_close_to_fp32_forward(tiny_model_dir, hf_logprobs):
    eng = EmbeddedEngine(
        tiny_model_dir,
        EngineOptions(max_batch=2, max_seq_len=128, dtype="bfloat16"),
    )
    try:
        g = await eng.generate(
            PROMPTS[2], SamplingParams(max_new_tokens=16, ignore_eos=True, seed=0), request_id="b"
        )
    finally:
        await eng.close()
    assert (hf_logprobs(PROMPTS[2], g.token_ids) - torch.tensor(g.logprobs)).abs().max().item() < 0.1


def test_unfiltered_temperature_1_logprobs_are_the_model_log_softmax():
    logits = torch.randn(3, 50)
    lp = filtered_logprobs(logits, torch.ones(3), torch.ones(3), torch.full((3,), -1))
    # two float32 log-softmaxes of 50 logits ~N(0, 1): a 50-term sum, then a subtraction
    assert torch.allclose(lp, torch.log_softmax(logits, -1), atol=drift(50, 2, 8.0))


def test_top_k_keeps_k_tokens_renormalised_at_temperature():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0, -1.0]])
    lp = filtered_logprobs(logits, torch.tensor([0.5]), torch.ones(1), torch.tensor([2]))
    # Tokens 0 and 2 survive; their probabilities are softmax([3, 2] / 0.5) = softmax([6, 4]).
    expected = torch.log_softmax(torch.tensor([6.0, 4.0]), -1)
    assert torch.isinf(lp[0, [1, 3, 4]]).all()
    assert torch.allclose(lp[0, [0, 2]], expected, atol=drift(2, 2, 6.0))


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lp = filtered_logprobs(probs.log(), torch.ones(1), torch.tensor([0.7]), torch.tensor([-1]))
    # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: the nucleus is the first two tokens, renormalised to 0.625 / 0.375.
    assert torch.isinf(lp[0, 2:]).all()
    assert torch.allclose(lp[0, :2].exp(), torch.tensor([0.625, 0.375]), atol=drift(4, 2, 1.0))


async def test_filtered_sampling_logprobs_are_under_the_distribution_sampled_from(engine, hf_model):
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=12, ignore_eos=True, seed=1)
    g = await engine.generate(PROMPTS[1], sp, request_id="f")
    with torch.no_grad():
        logits = (
            hf_model(torch.tensor([PROMPTS[1] + g.token_ids])).logits[0, len(PROMPTS[1]) - 1 : -1].float()
        )
    n = logits.shape[0]
    lp = filtered_logprobs(logits, torch.full((n,), 0.7), torch.full((n,), 0.9), torch.full((n,), 20))
    ref = lp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert (ref - torch.tensor(g.logprobs)).abs().max().item() <= TINY_LOGPROB_ATOL


async def test_seeded_request_gives_the_same_tokens_alone_or_in_a_batch(engine):
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True, seed=1234)
    alone = await engine.generate(PROMPTS[0], sp, request_id="alone")
    others = [
        engine.generate(p, SamplingParams(max_new_tokens=20, ignore_eos=True), request_id=f"o{i}")
        for i, p in enumerate(PROMPTS)
    ]
    batched, *_ = await asyncio.gather(engine.generate(PROMPTS[0], sp, request_id="batched"), *others)
    assert batched.token_ids == alone.token_ids
