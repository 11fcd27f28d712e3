"""Hybrid linear-attention models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE): the recurrent state in the engine's cache.

A Gated DeltaNet layer's state exists only at the end of what a slot was fed, so the engine reuses a
slot for a new prompt only when the prompt extends the slot's tokens exactly: the next turn of an
episode, or the continuation of a request a weight update aborted. Each test here drives the scheduler
step by step (no threads, no timing) and checks the log-probs against a plain transformers forward of
the whole sequence in fp32 (1e-4: see test_moe_parity.py for the bound).
"""

from __future__ import annotations

import pytest
import torch
from sparse_models import HYBRID_ARCHS
from test_moe_parity import FP32_TOLERANCE, hf_logprobs

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.scheduler import Output, Request, Scheduler

PROMPT = [11, 873, 42, 1999, 7, 3051, 260, 18, 4000, 19, 30, 512, 77, 2048, 9, 3]  # token ids (no tokenizer)


def run(sched: Scheduler, rid: str, prompt: list[int], *, steps: int | None = None, **sp) -> list[Output]:
    """Add a request and step the scheduler until it finishes (or `steps` steps ran); its outputs so far."""
    done: list[Output] = []
    sp.setdefault("ignore_eos", True)
    sched.add(Request(rid, list(prompt), SamplingParams(**sp), done.append))
    n = 0
    while sched.has_work() and not done and (steps is None or n < steps):
        sched.step()
        n += 1
    return done


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_next_turn_reuses_the_recurrent_state(arch, sparse_dir, hf_of):
    model_dir = sparse_dir(arch)
    sched = Scheduler(model_dir, EngineOptions(max_batch=2, max_seq_len=128), seed=0)
    first = run(sched, "t0", PROMPT, max_new_tokens=7, seed=1)[0].generation
    turn2 = PROMPT + first.token_ids + [4001, 198, 4002, 872, 198, 17]  # the env's tokens after the turn
    out = run(sched, "t1", turn2, max_new_tokens=6, seed=2)[0]
    assert out.cached_tokens == len(PROMPT) + len(first.token_ids) - 1  # every fed token's state kept
    got = torch.tensor(out.generation.logprobs)
    assert (
        hf_logprobs(hf_of(model_dir), turn2, out.generation.token_ids) - got
    ).abs().max() <= FP32_TOLERANCE


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_same_prompt_again_is_prefilled_from_scratch(arch, sparse_dir, hf_of):
    """A GRPO sibling (the same prompt): keys could be shared, the state at the prompt's end was never kept. One
    slot: the new request starts in the slot the first one left, whose conv inputs and state must not leak in."""
    model_dir = sparse_dir(arch)
    sched = Scheduler(model_dir, EngineOptions(max_batch=1, max_seq_len=128), seed=0)
    run(sched, "a", PROMPT, max_new_tokens=5, seed=1)
    out = run(sched, "b", PROMPT, max_new_tokens=5, seed=2)[0]
    assert out.cached_tokens == 0
    got = torch.tensor(out.generation.logprobs)
    assert (
        hf_logprobs(hf_of(model_dir), PROMPT, out.generation.token_ids) - got
    ).abs().max() <= FP32_TOLERANCE


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_aborted_turn_continues_under_new_weights(arch, sparse_dir, hf_of, tmp_path):
    """Partial rollout: abort mid-turn, load new weights, continue prompt + tokens so far. The continuation is
    what the new weights compute for the whole sequence (the old state is dropped with the old weights);
    without a weight update the continuation reuses the slot and matches the old weights."""
    from transformers import AutoModelForCausalLM

    model_dir = sparse_dir(arch)
    sched = Scheduler(model_dir, EngineOptions(max_batch=2, max_seq_len=128), seed=0)
    part = run(sched, "r", PROMPT, steps=4, max_new_tokens=40, seed=1)
    assert not part  # still running after 4 steps
    sched.pause()
    (aborted,) = part  # pause() finished it with what it had
    assert aborted.generation.finish_reason == "abort" and len(aborted.generation.token_ids) == 4
    sched.resume()
    so_far = PROMPT + aborted.generation.token_ids
    same = run(sched, "r.1", so_far, max_new_tokens=5, seed=2)[0]
    assert same.cached_tokens == len(so_far) - 1
    old = hf_of(model_dir)
    assert (
        hf_logprobs(old, so_far, same.generation.token_ids) - torch.tensor(same.generation.logprobs)
    ).abs().max() <= FP32_TOLERANCE

    torch.manual_seed(7)
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sched.update_weights(1, tensors={n: t.detach().clone() for n, t in new.state_dict().items()})
    cont = run(sched, "r.2", so_far, max_new_tokens=5, seed=3)[0]
    assert cont.cached_tokens == 0 and set(cont.generation.versions) == {1}
    got = torch.tensor(cont.generation.logprobs)
    assert (hf_logprobs(new, so_far, cont.generation.token_ids) - got).abs().max() <= FP32_TOLERANCE
