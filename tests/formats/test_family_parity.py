"""Engine vs Hugging Face forward on each supported family (Qwen3, Qwen2, Llama, Mistral), fp32 and bf16.

The log-prob the engine reports for every sampled token must be the log-softmax that a plain (uncached)
transformers forward of the same dtype computes for it: this is the behaviour log-prob the learner's
importance weights divide by. A batch of prompts of different lengths runs together (prefill + decode
over packed slots, the prefix cache on a repeated prompt), rendered with the family's chat template.
Every weight of the models is random, norm scales and biases included (families.py), so a norm the engine
swaps or skips shows; Mistral's prompts are longer than its sliding window, so the window shows too.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from families import FAMILIES, MISTRAL_WINDOW

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
@pytest.mark.parametrize("family", FAMILIES)
async def test_engine_logprobs_equal_hf_forward(family, dtype, family_dir, rendered):
    from transformers import AutoModelForCausalLM

    model_dir = family_dir(family)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    prompts = list(rendered(family))
    assert (
        family != "mistral" or min(len(p) for p in prompts) > MISTRAL_WINDOW
    )  # every prompt past the window
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


# fp32 logits of the same math in another op order differ by ~1e-6 relative (a 64-wide model, 2 layers); a
# greedy choice is only defined up to that, so two top logits closer than this may come out either way.
NEAR_TIE = 1e-4


@pytest.mark.parametrize("family", FAMILIES)
async def test_greedy_generation_equals_hf_generate(family, family_dir, rendered):
    """Greedy decoding (prefill, then cached decode steps, several prompts batched) writes what transformers'
    `generate` writes, token for token, up to a near-tie of the two top logits."""
    from transformers import AutoModelForCausalLM

    model_dir = family_dir(family)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = rendered(family)
    n = 24
    eng = EmbeddedEngine(model_dir, EngineOptions(max_batch=4, max_seq_len=256))
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
        gens = await asyncio.gather(
            *(eng.generate(p, greedy, request_id=str(i)) for i, p in enumerate(prompts))
        )
    finally:
        await eng.close()
    for p, g in zip(prompts, gens, strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        want = ref[0, len(p) :].tolist()
        same = next((i for i, (a, b) in enumerate(zip(g.token_ids, want, strict=True)) if a != b), n)
        if same < n:  # they part only where HF's own two best logits are a near-tie
            with torch.no_grad():
                top2 = hf(torch.tensor([p + want[:same]])).logits[0, -1].float().topk(2).values
            assert float(top2[0] - top2[1]) < NEAR_TIE, (family, same, g.token_ids, want)
        assert same >= n // 2, (family, same)  # most of the sequence agrees exactly


def test_every_weight_of_the_parity_models_is_random(family_dir):
    """No parameter is constant (transformers initialises norm scales to 1 and biases to 0): a parity test on a
    constant norm cannot tell q_norm from k_norm, nor a skipped norm scale from a applied one."""
    from safetensors.torch import load_file

    for family in FAMILIES:
        state = load_file(str(family_dir(family) / "model.safetensors"))
        constant = [n for n, t in state.items() if t.numel() > 1 and bool((t == t.flatten()[0]).all())]
        assert not constant, (family, constant)
        assert any("norm" in n for n in state) and (
            family != "qwen2" or any(n.endswith(".bias") for n in state)
        )


async def test_qwen3_q_and_k_norms_each_reach_the_engine(family_dir, rendered, tmp_path):
    """Qwen3's q_norm and k_norm scales matter and are applied where they belong: swapping the two in the
    checkpoint moves HF's log-probs far beyond the parity tolerance, and the engine follows HF in both
    checkpoints (an engine that swapped, dropped or ignored them fails one of the two)."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    base = family_dir("qwen3")
    swapped = tmp_path / "swapped"
    shutil.copytree(base, swapped)
    state = load_file(str(base / "model.safetensors"))
    for name in [n for n in state if n.endswith("q_norm.weight")]:
        k = name.replace("q_norm", "k_norm")
        state[name], state[k] = state[k].clone(), state[name].clone()
    save_file(state, str(swapped / "model.safetensors"), metadata={"format": "pt"})
    prompt = rendered("qwen3")[0]
    out: dict[str, torch.Tensor] = {}
    for name, model_dir in (("base", base), ("swapped", swapped)):
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        eng = EmbeddedEngine(model_dir, EngineOptions(max_batch=1, max_seq_len=256))
        try:
            g = await eng.generate(
                prompt, SamplingParams(max_new_tokens=8, ignore_eos=True, seed=0), request_id="a"
            )
        finally:
            await eng.close()
        ref = hf_logprobs(hf, prompt, g.token_ids)
        assert (ref - torch.tensor(g.logprobs)).abs().max().item() <= TOLERANCE["float32"], name
        with torch.no_grad():  # the next-token distribution after the prompt, to compare the two checkpoints
            out[name] = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    assert (out["base"] - out["swapped"]).abs().max().item() > 100 * TOLERANCE["float32"]


def test_mistral_window_changes_what_hf_computes_on_these_prompts(family_dir, rendered, tmp_path):
    """The parity prompts see Mistral's window: without it (sliding_window null) transformers' log-probs move far
    beyond the parity tolerance, so the engine matching the windowed model means it applies the window."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    full = tmp_path / "full"
    shutil.copytree(family_dir("mistral"), full)
    cfg = json.loads((full / "config.json").read_text())
    assert cfg["sliding_window"] == MISTRAL_WINDOW
    (full / "config.json").write_text(json.dumps({**cfg, "sliding_window": None}))
    ids = torch.tensor([rendered("mistral")[1]])
    with torch.no_grad():
        lp = [
            torch.log_softmax(
                AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)(ids).logits[0].float(), -1
            )
            for d in (family_dir("mistral"), full)
        ]
    assert (lp[0] - lp[1]).abs().max().item() > 100 * TOLERANCE["float32"]


def test_torch_learner_logprobs_on_mistral_equal_the_engines(family_dir, rendered):
    """The torch learner (transformers underneath: its Mistral applies the window) computes, for trajectories the
    engine sampled past the window, the engine's log-probs: no train-inference mismatch from the window."""
    from agent_rl.config import Recipe
    from agent_rl.learners.torch_learner import build_learner
    from agent_rl.types import Group, Trajectory

    model_dir = family_dir("mistral")

    async def sample() -> list:
        eng = EmbeddedEngine(model_dir, EngineOptions(max_batch=4, max_seq_len=256))
        try:
            return await asyncio.gather(
                *(
                    eng.generate(
                        p,
                        SamplingParams(max_new_tokens=10 + 6 * i, ignore_eos=True, seed=i),
                        request_id=str(i),
                    )
                    for i, p in enumerate(rendered("mistral"))
                )
            )
        finally:
            await eng.close()

    gens = asyncio.run(sample())
    trajs = []
    for i, (p, g) in enumerate(zip(rendered("mistral"), gens, strict=True)):
        t = Trajectory(uid=f"g/{i}", group_id="g", prompt_ids=list(p))
        t.append_sampled(g.token_ids, g.logprobs, g.versions)
        t.reward = float(i % 2)
        trajs.append(t)
    recipe = Recipe.model_validate(
        {
            "name": "mistral-learner",
            "model": {"path": str(model_dir)},
            "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 1, "batch_prompts": 1},
            "learner": {"lr": 1e-4, "weight_decay": 0.0, "micro_batch_size": 3},
        }
    )
    learner = build_learner(recipe.learner_spec)
    try:
        learner.step([Group("g", trajs)])
        rows = learner.trained_rows()
    finally:
        learner.close()
    for t, g in zip(trajs, gens, strict=True):
        n = len(t.prompt_ids)
        got = rows[t.uid].logprobs[n : n + len(g.token_ids)]
        assert (got - torch.tensor(g.logprobs)).abs().max().item() <= TOLERANCE["float32"], t.uid
