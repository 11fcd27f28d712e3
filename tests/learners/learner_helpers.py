"""Test data for the learner tests: groups over the tiny model, with behaviour log-probs from real weights."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch

from agent_rl.config import Recipe
from agent_rl.types import Group, Trajectory

CPU = {"device": "cpu"}
"""learner.device for tests that compare the learner with a reference computed on the CPU in the test (an HF
model loaded here, the embedded engine, a checkpoint reloaded, another learner whose ranks get no GPU): with a
GPU present the learner would take it (device auto), and the test is about the comparison, not the device."""


@functools.lru_cache(maxsize=2)
def _load(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def behaviour_logprobs(
    model_dir: Path, seqs: list[list[int]], *, noise: float = 0.0, seed: int = 0
) -> list[list[float]]:
    """log p(token | prefix) under the weights in `model_dir` (perturbed by `noise` to fake a stale policy)."""
    from vcpo.logprobs import logprobs_of

    model = _load(str(model_dir))
    if noise:
        model = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn(p.shape, generator=gen))
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            out.append(logprobs_of(model, ids, torch.ones_like(ids))[0].tolist())
    return out


def make_groups(
    model_dir: Path,
    *,
    n_groups: int = 2,
    n: int = 2,
    seed: int = 0,
    noise: float = 0.0,
    version: int = 0,
) -> list[Group]:
    """n_groups prompts x n samples: random prompt, a sampled turn, a tool turn, a sampled turn; rewards alternate."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    gen = torch.Generator().manual_seed(seed)
    groups, plan = [], []
    for g in range(n_groups):
        prompt = torch.randint(
            3, vocab, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen
        ).tolist()
        for i in range(n):
            lens = [int(x) for x in torch.randint(2, 9, (3,), generator=gen)]
            parts = [torch.randint(3, vocab, (k,), generator=gen).tolist() for k in lens]
            plan.append((g, i, prompt, parts))
    seqs = [prompt + parts[0] + parts[1] + parts[2] for _, _, prompt, parts in plan]
    lps = behaviour_logprobs(model_dir, seqs, noise=noise, seed=seed)
    trajs: dict[int, list[Trajectory]] = {}
    for (g, i, prompt, parts), lp in zip(plan, lps, strict=True):
        t = Trajectory(uid=f"g{g}-{i}", group_id=f"g{g}", prompt_ids=prompt)
        a, b = len(prompt), len(prompt) + len(parts[0])
        t.append_sampled(parts[0], lp[a:b], version)
        t.append_env(parts[1])
        c = b + len(parts[1])
        t.append_sampled(parts[2], lp[c : c + len(parts[2])], version)
        t.reward = float((g + i) % 2)
        trajs.setdefault(g, []).append(t)
    for g, ts in trajs.items():
        groups.append(Group(f"g{g}", ts))
    return groups


def recipe_for(
    model_dir: Path,
    *,
    steps: int = 10,
    learner: dict | None = None,
    algorithm: dict | None = None,
    model_dtype: str = "float32",
) -> Recipe:
    return Recipe.model_validate(
        {
            "name": "learner-test",
            "model": {"path": str(model_dir), "dtype": model_dtype},
            "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": steps, "batch_prompts": 2},
            "learner": {"lr": 1e-3, "weight_decay": 0.0, **(learner or {})},
            "algorithm": algorithm or {},
        }
    )


def first_gradient(learner_dir: Path) -> dict[str, torch.Tensor]:
    """The gradient of a learner's first (and only) step, read back from its checkpoint's AdamW state: after one
    step exp_avg = (1 - beta1) g exactly (the moments start at 0), with g clipped and data-parallel-summed, i.e.
    what the step computed, defined up to float rounding (unlike the weights: Adam's first update is
    ~lr * g / |g|, so an element whose gradient is near 0 moves by up to lr under any rounding difference)."""
    opt = torch.load(learner_dir / "optimizer.pt", weights_only=True)["optimizer"]
    beta1 = opt["param_groups"][0]["betas"][0]
    return {str(i): s["exp_avg"] / (1 - beta1) for i, s in opt["state"].items()}
