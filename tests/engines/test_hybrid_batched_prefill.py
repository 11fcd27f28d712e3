"""The embedded engine's batched prefill of hybrid models (Qwen3-Next, Qwen3.5): several prompts prefilled in one
forward, their real tokens packed into one sequence through the Gated DeltaNet layers (agent_rl.varlen_delta_rule),
each computes what it computes alone: a fresh prompt from a zero conv and recurrent state, a next turn from its own
slot's, and nothing of one prompt reaches the prompt packed after it.

The scheduler is stepped by hand (no threads, no timing); the reference is a plain transformers forward of each
whole sequence in fp32, within test_moe_parity.py's 1e-4 (the same math in another order: fp32 rounding over a
few hundred-term sums and four layers stays near 1e-6; a leaked state moves log-probs by 1e-2 or more)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))
from sparse_models import sparse_model  # noqa: E402

from agent_rl.engines.api import EngineOptions, SamplingParams  # noqa: E402
from agent_rl.engines.embedded.scheduler import Output, Request, Scheduler  # noqa: E402

FP32_TOLERANCE = 1e-4
FIRST = [11, 873, 42, 1999, 7, 3051, 260, 18, 4000, 19, 30, 512, 77, 2048, 9, 3]  # token ids (no tokenizer)


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5"])  # both projection layouts
def hybrid_dir(request, tmp_path_factory):
    return sparse_model(request.param, tmp_path_factory.mktemp(request.param))


def _hf_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


def test_prompts_prefilled_together_each_equal_their_sequence_alone(hybrid_dir) -> None:
    from transformers import AutoModelForCausalLM

    sched = Scheduler(hybrid_dir, EngineOptions(max_batch=4, max_seq_len=256), seed=0)
    done: dict[str, Output] = {}

    def add(rid: str, prompt: list[int], seed: int) -> None:
        sp = SamplingParams(max_new_tokens=6, seed=seed, ignore_eos=True)
        sched.add(Request(rid, list(prompt), sp, lambda o: done.__setitem__(o.rid, o)))

    add("turn1", FIRST, 1)
    while "turn1" not in done:
        sched.step()
    g = torch.Generator().manual_seed(5)
    turn2 = FIRST + done["turn1"].generation.token_ids + [4001, 198, 4002, 872, 198, 17]
    prompts = {
        "turn2": turn2,  # continues the cached slot: starts from its conv inputs and state
        "long": torch.randint(0, 4000, (70,), generator=g).tolist(),  # two 64-token chunks
        "short": [5, 6, 7],  # shorter than the conv kernel
        "mid": torch.randint(0, 4000, (20,), generator=g).tolist(),
    }
    for i, (rid, p) in enumerate(prompts.items()):
        add(rid, p, 10 + i)
    sched.step()
    assert {r.rid for r in sched.running} == set(prompts) and all(
        len(r.tokens) == 1 for r in sched.running
    ), "the four prompts were not prefilled in one forward"
    while sched.has_work():
        sched.step()
    assert done["turn2"].cached_tokens == len(FIRST) + len(done["turn1"].generation.token_ids) - 1
    hf = AutoModelForCausalLM.from_pretrained(hybrid_dir, dtype=torch.float32).eval()
    for rid, p in prompts.items():
        out = done[rid].generation
        worst = float((_hf_logprobs(hf, p, out.token_ids) - torch.tensor(out.logprobs)).abs().max())
        assert worst <= FP32_TOLERANCE, f"{rid}: {worst:.3g} from its sequence alone"
