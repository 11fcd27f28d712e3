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
    from agent_rl.learners.megatron.model import ParallelConfig

    model, par, groups, _ = _parallel_model(
        rank, world, port, model_dir, ParallelConfig(tp=world, sp=sp), recompute
    )
    return model, par, groups


def _parallel_model(rank: int, world: int, port: int, model_dir: str, par, recompute=None):
    """Join a gloo group of `world` = tp * cp ranks; (this rank's fp32 GPTModel shard, par, groups, shape)."""
    import torch.distributed as dist

    from agent_rl.learners.megatron.convert import load_hf_into_megatron
    from agent_rl.learners.megatron.model import build_gpt_model, freeze_padding_row
    from agent_rl.learners.megatron.rank import init_model_parallel, load_hf_weights
    from agent_rl.learners.megatron.shape import shape_from_hf_config

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = init_model_parallel(par, dp=1, cpu=True)
    cfg, state = load_hf_weights(model_dir)
    shape = shape_from_hf_config(cfg)
    model = build_gpt_model(shape, par, cpu=True, **({"recompute": recompute} if recompute else {}))
    load_hf_into_megatron(model, state, shape, tp_rank=groups.tp_rank, tp_size=par.tp, te=False)
    freeze_padding_row(model, shape, tp_rank=groups.tp_rank)
    return model, par, groups, shape


def packed_and_alone_worker(rank: int, world: int, port: int, model_dir: str, par, batch, out: str) -> None:
    """One rank of a tp * cp layout: log-probs and the full-model gradient (HF names) of Σ masked log-probs, once
    for the batch packed into one sequence and once with every trajectory run alone (gradients summed); rank 0
    saves {"packed": (lp, grads), "alone": (lp, grads)}."""
    from agent_rl.learners.megatron.convert import gather_hf_state_dict
    from agent_rl.learners.megatron.grads import finish_backward
    from agent_rl.learners.megatron.logprobs import megatron_logprobs

    model, par, groups, shape = _parallel_model(rank, world, port, model_dir, par)
    params = dict(model.named_parameters())

    def run(rows: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
        for p in params.values():
            p.grad = None
        lps = []
        for idx in rows:
            sub = batch.select(idx)
            lp = megatron_logprobs(
                model, sub.input_ids, sub.attention_mask, par=par, cp_group=groups.cp, pack=True
            )
            (lp * sub.loss_mask).sum().backward()
            lps.append(torch.nn.functional.pad(lp.detach(), (0, batch.input_ids.shape[1] - lp.shape[1])))
        finish_backward(list(params.values()), groups)
        grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in params.items()}
        return torch.cat(lps), gather_hf_state_dict(grads, shape, tp_group=groups.tp, te=False)

    result = {
        "packed": run([torch.arange(batch.size)]),
        "alone": run([torch.tensor([i]) for i in range(batch.size)]),
    }
    if rank == 0:
        torch.save(result, out)
    exit_worker()


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
        lp = megatron_logprobs(model, sub.input_ids, sub.attention_mask, par=par)
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
        lp = megatron_logprobs(model, batch.input_ids, batch.attention_mask, par=par, pack=pack)
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
            lp = megatron_logprobs(model, batch.input_ids, batch.attention_mask, par=par)
        (lp * batch.loss_mask).sum().backward()
        result[name] = (
            saved[0],
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    if rank == 0:
        torch.save(result, out)
    exit_worker()


def rank_step_worker(
    rank: int, world: int, port: int, specs: dict, shares: list, out: str, routes: list | None = None
) -> None:
    """One learner rank: for each MegatronSpec of `specs` (all with the same layout), build a MegatronRank, take one
    step on `shares` (one PolicyBatch per DP rank; MoE: with DP rank d's RouteBatch `routes[d]`) and record, in HF
    names (TP shards gathered):
    - `before`: the weights the rank hands out before the step (the HF -> Megatron -> HF round trip);
    - `grads`: the fp32 gradient the optimizer steps with (captured right before optimizer.step(); zeros for a
      parameter without one, e.g. an expert that received no token);
    - `weights`: what the learner hands to engines afterwards (hf_state_dict, fp32 here);
    - `model`: the compute model's own parameters afterwards (bf16 for learner.dtype bfloat16);
    - `metrics`, and `logprobs`: the per-trajectory log-probs of that step (RowResults).
    Rank 0 saves {name: record}."""
    from agent_rl.learners._dp import join_rank_group
    from agent_rl.learners.megatron.convert import gather_hf_state_dict
    from agent_rl.learners.megatron.rank import MegatronRank

    torch.set_num_threads(1)
    join_rank_group(rank, world, f"tcp://127.0.0.1:{port}", device="cpu")
    result = {}
    for name, spec in specs.items():
        learner = MegatronRank(spec)
        captured: dict = {}

        def capture(*_unused, learner=learner, captured=captured) -> None:
            grads = {
                n: p.grad if p.grad is not None else torch.zeros_like(p)
                for n, p in learner.fp32_parameters().items()
            }
            captured["grads"] = gather_hf_state_dict(
                grads, learner.shape, tp_group=learner.groups.tp, te=False
            )

        learner.optimizer.register_step_pre_hook(capture)
        before = learner.hf_state_dict()  # a collective on every rank
        metrics = learner.step(shares, routes[learner.dp_rank]) if routes else learner.step(shares)
        weights = learner.hf_state_dict()  # a collective on every rank
        model = gather_hf_state_dict(learner.model, learner.shape, tp_group=learner.groups.tp, te=False)
        _, rows = learner.last_rows()
        result[name] = {
            "before": before,
            "metrics": metrics,
            "grads": captured["grads"],
            "weights": weights,
            "model": model,
            "logprobs": rows.logprobs,
        }
    if rank == 0:
        torch.save(result, out)
    exit_worker()


def spawn_ranks(fn, args: tuple, nprocs: int) -> None:
    """torch.multiprocessing.spawn, started the way the learner's pools start here (conftest.py: a fork server;
    `spawn` itself ignores its start_method)."""
    from agent_rl.learners import _processes

    torch.multiprocessing.start_processes(fn, args=args, nprocs=nprocs, start_method=_processes.START_METHOD)


def run_rank_steps(specs: dict, shares: list, tmp: Path, routes: list | None = None) -> dict:
    """rank_step_worker in spec.world gloo processes; {name: record} of global rank 0."""
    from agent_rl.learners._dp import _free_port

    world = next(iter(specs.values())).world
    out = tmp / "rank_steps.pt"
    spawn_ranks(rank_step_worker, (world, _free_port(), specs, shares, str(out), routes), world)
    return torch.load(out, weights_only=False)


def reference_step(model_dir: Path, spec, batch) -> dict:
    """vcpo.Step on the HF model in fp32 (what the torch learner runs), with the learner's step config, AdamW
    and parameter groups: the same record as rank_step_worker (grads before optimizer.step, weights after)."""
    from transformers import AutoModelForCausalLM

    from vcpo.logprobs import logprobs_of
    from vcpo.step import Step

    rs = spec.rank
    torch.manual_seed(rs.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": rs.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=rs.lr,
        betas=rs.betas,
    )
    captured: dict = {}

    def capture(*_unused) -> None:
        captured["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}

    optimizer.register_step_pre_hook(capture)
    metrics = Step(model, optimizer, rs.step, logprob_fn=logprobs_of)(batch).as_dict()
    grads = captured["grads"]
    if model.config.tie_word_embeddings:
        grads["lm_head.weight"] = grads["model.embed_tokens.weight"]
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"metrics": metrics, "grads": grads, "weights": weights}


def adamw_replay(initial: dict, grads: dict, spec, lr: float) -> dict:
    """One AdamW step (the learner's betas, weight decay on >= 2-D tensors) from `initial` with `grads` at `lr`."""
    rs = spec.rank
    params = {k: torch.nn.Parameter(v.detach().clone().float()) for k, v in initial.items()}
    for k, p in params.items():
        p.grad = grads[k].float().clone()
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": rs.weight_decay},
            {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=rs.betas,
    )
    optimizer.step()
    return {k: p.detach() for k, p in params.items()}


def saved_bytes_worker(
    rank: int, world: int, port: int, model_dir: str, lengths: list[int], out: str
) -> None:
    from agent_rl.learners.megatron.logprobs import megatron_logprobs
    from agent_rl.learners.megatron.model import ParallelConfig

    """One rank (world 1): bytes of distinct storages autograd saves in a forward of one trajectory per length."""
    model, par, _, shape = _parallel_model(rank, world, port, model_dir, ParallelConfig())
    saved = {}
    for n in lengths:
        ids = torch.randint(0, shape.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        seen: dict[int, int] = {}

        def keep(t: torch.Tensor, seen: dict = seen) -> torch.Tensor:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            megatron_logprobs(model, ids, torch.ones_like(ids), par=par, pack=True)
        saved[n] = sum(seen.values())
    torch.save(saved, out)
    exit_worker()


def packed_bounds_reads_worker(rank: int, world: int, port: int, model_dir: str, batch, out: str) -> None:
    """One TP=1 rank: a packed forward and backward under a spy that records every torch call on the device copies
    of the pack's cu_seqlens (what RoPE and attention read must come from their host copies); saves the calls."""
    from torch.overrides import TorchFunctionMode

    from agent_rl.learners.megatron import packing
    from agent_rl.learners.megatron.logprobs import megatron_logprobs

    model, par, _ = _tp_model(rank, world, port, model_dir, sp=False)
    made: list[torch.Tensor] = []
    build = packing.packed_seq_params

    def capture(layout, device):  # noqa: ANN001, ANN202
        params = build(layout, device)
        made.extend(
            [
                params.cu_seqlens_q,
                params.cu_seqlens_kv,
                params.cu_seqlens_q_padded,
                params.cu_seqlens_kv_padded,
            ]
        )
        return params

    class Spy(TorchFunctionMode):
        calls: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if args and any(args[0] is t for t in made):
                self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    packing.packed_seq_params = capture
    with Spy() as spy:
        lp = megatron_logprobs(model, batch.input_ids, batch.attention_mask, par=par, pack=True)
        (lp * batch.loss_mask).sum().backward()
    torch.save({"calls": spy.calls, "made": len(made)}, out)
    exit_worker()
