"""Megatron MoE tests' pieces: one MegatronRank step with the rollout routing, and the torch learner's on one rank."""

from __future__ import annotations

from pathlib import Path

import torch
from gloo_exit import exit_worker


def moe_rank_step_worker(
    rank: int, world: int, port: int, specs: dict, shares: list, routes: list, out: str
) -> None:
    """One learner rank: for each MegatronSpec of `specs`, a MegatronRank takes one step on `shares` with DP rank d's
    RouteBatch `routes[d]`; records the fp32 gradient the optimizer steps with (HF names; zeros for an expert that
    received no token), the step's metrics (routing counts included) and the current log-probs. Rank 0 saves
    {name: record}; the weights before the step are recorded too (the HF -> Megatron -> HF round trip)."""
    from agent_rl.learners._pool import join_rank_group
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
        before = learner.hf_state_dict()
        metrics = learner.step(shares, routes[learner.dp_rank])
        _, rows = learner.last_rows()
        result[name] = {
            "metrics": metrics,
            "grads": captured["grads"],
            "logprobs": rows.logprobs,
            "before": before,
        }
    if rank == 0:
        torch.save(result, out)
    exit_worker()


def run_moe_rank_steps(specs: dict, shares: list, routes: list, tmp: Path) -> dict:
    """moe_rank_step_worker in spec.world gloo processes; {name: record} of global rank 0."""
    from agent_rl.learners._pool import free_port

    world = next(iter(specs.values())).world
    out = tmp / "moe_rank_steps.pt"
    torch.multiprocessing.spawn(
        moe_rank_step_worker, args=(world, free_port(), specs, shares, routes, str(out)), nprocs=world
    )
    return torch.load(out, weights_only=False)


def torch_rank_step(rank_spec, batch, routes) -> dict:
    """The torch learner's rank (transformers' model, its routing replay hooks) on the whole batch: the same record."""
    from agent_rl.learners._torch_rank import TorchRank

    learner = TorchRank(rank_spec)
    captured: dict = {}

    def capture(*_unused) -> None:
        captured["grads"] = {n: p.grad.clone() for n, p in learner.model.named_parameters()}

    learner.optimizer.register_step_pre_hook(capture)
    metrics = learner.step(batch, routes)
    return {"metrics": metrics, "grads": captured["grads"], "logprobs": learner.last_rows().logprobs}
