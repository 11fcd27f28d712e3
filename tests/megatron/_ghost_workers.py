"""Rank workers of the Megatron ghost-norm tests (test_ghost_megatron.py): spawned as gloo processes."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _helpers import _parallel_model
from gloo_exit import exit_worker


def _reference_by_layer(model, f_i: torch.Tensor, groups) -> dict[str, torch.Tensor]:
    """Each trajectory's own gradient from the same forward graph (autograd.grad of f_i alone), finished as the
    learner finishes a gradient (grads.finish_backward: SP-tagged weights summed over TP) and squared per layer with
    TP duplicates counted once (grads.counts_once), summed over TP: {module path: [n] float64}."""
    from agent_rl.learners.megatron.grads import counts_once

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    paths = sorted({n.rsplit(".", 1)[0] for n, _ in named})
    local = torch.zeros(len(paths), f_i.shape[0], dtype=torch.float64)
    for i in range(f_i.shape[0]):
        grads = torch.autograd.grad(f_i[i], [p for _, p in named], retain_graph=True, allow_unused=True)
        for (name, p), g in zip(named, grads, strict=True):
            if g is None:
                continue
            g = g.double()
            if groups.tp is not None and getattr(p, "sequence_parallel", False):
                dist.all_reduce(g, group=groups.tp)
            if counts_once(p, groups.tp_rank):
                local[paths.index(name.rsplit(".", 1)[0]), i] += g.pow(2).sum()
    if groups.tp is not None:
        dist.all_reduce(local, group=groups.tp)
    return dict(zip(paths, local, strict=True))


def ghost_layers_worker(rank: int, world: int, port: int, par, cases: dict, batch, out: str) -> None:
    """One rank of a tp layout: for each case (model_dir, pack), the ghost norms of every layer and in total of
    the micro-batch `batch`, and the reference per layer (`_reference_by_layer`); rank 0 saves {case: record}."""
    from agent_rl.learners.megatron.ghost import MegatronGhostNorms
    from agent_rl.learners.megatron.logprobs import megatron_logprobs

    result = {}
    for name, (model_dir, pack) in cases.items():
        model, par, groups, _ = _parallel_model(rank, world, port, model_dir, par)
        by_layer: dict[str, torch.Tensor] = {}
        ghost = MegatronGhostNorms(model, par=par, groups=groups, pack=pack, by_layer=by_layer)
        lengths = batch.attention_mask.sum(-1).tolist()
        with ghost.capture(batch.input_ids, batch.loss_mask, lengths):
            lp = megatron_logprobs(model, batch.input_ids, batch.attention_mask, par=par, pack=pack)
            f_i = (lp * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1)
            total = ghost.norms(f_i.sum(), retain_graph=True)
        ghost.remove()
        result[name] = {
            "ghost": {k: v.clone() for k, v in by_layer.items()},
            "total": total.clone(),
            "want": _reference_by_layer(model, f_i, groups),
        }
    if rank == 0:
        torch.save(result, out)
    exit_worker()


def ghost_step_worker(rank: int, world: int, port: int, specs: dict, share, out: str) -> None:
    """One learner rank: for each MegatronSpec of `specs` (one layout), a MegatronRank's step on `share`: the
    metrics, the fp32 gradient the optimizer steps with (HF names, TP shards gathered) and which ghost hooks the
    step built (None: a backward per trajectory). Rank 0 saves {name: record}."""
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
            grads = {n: p.grad if p.grad is not None else torch.zeros_like(p)
                     for n, p in learner.fp32_parameters().items()}  # fmt: skip
            captured["grads"] = gather_hf_state_dict(
                grads, learner.shape, tp_group=learner.groups.tp, te=False
            )

        learner.optimizer.register_step_pre_hook(capture)
        metrics = learner.step([share])
        ghost = learner._step.ghost
        result[name] = {
            "metrics": metrics,
            "grads": captured["grads"],
            "ghost": None if ghost is None else type(ghost).__name__,
        }
    if rank == 0:
        torch.save(result, out)
    exit_worker()
