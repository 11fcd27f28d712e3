"""Shared pieces of the megatron tests: a tiny model, batches near the current policy, a TP worker."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from gloo_exit import exit_worker

from agent_rl.config import Recipe
from agent_rl.types import Group, Trajectory

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
requires_megatron = [
    pytest.mark.megatron,
    pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed: pip install 'agent-rl[gpu]'"),
]


def build_tiny_dir(out: Path) -> Path:
    """Qwen2, hidden 64, 2 layers, 4 heads / 2 KV heads, vocab 320 (divisible by tp=2), with a tokenizer."""
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    return build_tiny(
        out, sample_corpus(), vocab_size=320, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128
    )


def recipe(model_dir: Path, algorithm: dict | None = None, **learner) -> Recipe:
    return Recipe.model_validate(
        {
            "algorithm": algorithm or {},
            "name": "megatron-test",
            "model": {"path": str(model_dir)},
            "envs": {"train": "unused.yaml"},
            "train": {"steps": 4, "batch_prompts": 2},
            "learner": {"lr": 3e-3, "weight_decay": 0.1, **learner},
        }
    )


def make_groups(model_dir: Path, seed: int, n_groups: int = 2, n: int = 3) -> list[Group]:
    """Groups whose behaviour log-probs are the model's own plus noise (IS weights near, not at, 1).

    Lengths are odd and differ per trajectory so SP padding and right-padding both matter;
    each trajectory has two sampled segments around an env segment (loss mask 0).
    """
    from transformers import AutoModelForCausalLM

    from vcpo.logprobs import logprobs_of

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(n_groups):
        trajs = []
        for j in range(n):
            prompt = torch.randint(0, vocab, (5 + j,), generator=g)
            resp = torch.randint(0, vocab, (8 + 3 * j + 2 * gi,), generator=g)
            ids = torch.cat([prompt, resp])[None]
            with torch.no_grad():
                lp = logprobs_of(model, ids, torch.ones_like(ids))[0, len(prompt) :]
            behaviour = (lp + 0.3 * torch.randn(len(resp), generator=g)).clamp(max=-1e-3).tolist()
            t = Trajectory(uid=f"{seed}-{gi}-{j}", group_id=f"{seed}-{gi}", prompt_ids=prompt.tolist())
            r = resp.tolist()
            t.append_sampled(r[:4], behaviour[:4], 0)
            t.append_env(r[4:6])
            t.append_sampled(r[6:], behaviour[6:], 0)
            t.reward = float((j + gi + seed) % 2)
            trajs.append(t)
        groups.append(Group(f"{seed}-{gi}", trajs))
    return groups


def _tp_model(rank: int, world: int, port: int, model_dir: str, sp: bool, recompute=None):
    """Join a gloo group of `world` TP ranks and load the HF weights into this rank's GPTModel shard."""
    import torch.distributed as dist

    from agent_rl.learners.megatron.convert import load_hf_into_megatron
    from agent_rl.learners.megatron.model import ParallelConfig, build_gpt_model, freeze_padding_row
    from agent_rl.learners.megatron.rank import init_model_parallel, load_hf_weights
    from agent_rl.learners.megatron.shape import shape_from_hf_config

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    par = ParallelConfig(tp=world, sp=sp)
    groups = init_model_parallel(par, dp=1)
    cfg, state = load_hf_weights(model_dir)
    shape = shape_from_hf_config(cfg)
    model = build_gpt_model(shape, par, cpu=True, **({"recompute": recompute} if recompute else {}))
    load_hf_into_megatron(model, state, shape, tp_rank=rank, tp_size=world, te=False)
    freeze_padding_row(model, shape, tp_rank=rank)
    return model, par, groups


def trajectory_grad_norms_worker(
    rank: int, world: int, port: int, model_dir: str, sp: bool, batch, out: str
) -> None:
    """One TP rank: ‖∇ mean_t log π(τ_i)‖ of each row of `batch`, via the learner's own reductions; rank 0 saves."""

    from agent_rl.learners.megatron.grads import finish_backward, grad_sq_norm
    from agent_rl.learners.megatron.logprobs import megatron_logprobs

    model, par, groups = _tp_model(rank, world, port, model_dir, sp)
    params = list(model.parameters())
    norms, logprobs = [], []
    for i in range(batch.size):
        sub = batch.select(torch.tensor([i]))
        for p in params:
            p.grad = None
        lp = megatron_logprobs(model, sub.input_ids, sub.attention_mask, par=par, dense_mask=True)
        ((lp * sub.loss_mask).sum() / sub.loss_mask.sum()).backward()
        finish_backward(params, groups)
        norms.append(grad_sq_norm(params, [p.grad for p in params], groups) ** 0.5)
        logprobs.append(lp.detach()[0])
    if rank == 0:
        torch.save({"norms": norms, "logprobs": logprobs}, out)
    exit_worker()


def packed_vs_padded_worker(
    rank: int, world: int, port: int, model_dir: str, sp: bool, batch, out: str
) -> None:
    """One TP rank: log-probs and the gradient norm of Σ masked log-probs over the whole micro-batch,
    once packed and once right-padded; rank 0 saves both."""

    from agent_rl.learners.megatron.grads import finish_backward, grad_sq_norm
    from agent_rl.learners.megatron.logprobs import megatron_logprobs

    model, par, groups = _tp_model(rank, world, port, model_dir, sp)
    params = list(model.parameters())
    result = {}
    for pack in (False, True):
        for p in params:
            p.grad = None
        lp = megatron_logprobs(
            model, batch.input_ids, batch.attention_mask, par=par, dense_mask=True, pack=pack
        )
        (lp * batch.loss_mask).sum().backward()
        finish_backward(params, groups)
        result[pack] = (lp.detach(), grad_sq_norm(params, [p.grad for p in params], groups) ** 0.5)
    if rank == 0:
        torch.save(result, out)
    exit_worker()


def saved_activations_worker(
    rank: int, world: int, port: int, model_dir: str, sp: bool, recomputes: dict, batch, out: str
) -> None:
    """One TP rank, once per activation-recompute setting: the bytes autograd keeps from the forward pass for the
    backward (saved_tensors_hooks: what activation memory is, independent of the allocator), and the gradients."""
    from agent_rl.learners.megatron.logprobs import megatron_logprobs

    result = {}
    for name, recompute in recomputes.items():
        model, par, _ = _tp_model(rank, world, port, model_dir, sp, recompute)
        model.train()
        saved = [0]

        def keep(t: torch.Tensor, saved: list[int] = saved) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            lp = megatron_logprobs(model, batch.input_ids, batch.attention_mask, par=par, dense_mask=True)
        (lp * batch.loss_mask).sum().backward()
        result[name] = (
            saved[0],
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    if rank == 0:
        torch.save(result, out)
    exit_worker()
