"""vcpo.Step on a Megatron model-parallel shard: vcpo's own math, with TP/SP/CP-aware gradient hooks.

vcpo.Step sees gradients as whole-model tensors. On a TP x CP shard they must first be
*finished* (`grads.finish_backward`: sequence-parallel norm gradients summed over TP,
gradients averaged over CP), and norms must be reduced over TP with TP-duplicates counted
once (`grads.grad_sq_norm`). Both go through vcpo's hooks:

- exact OPOB (one backward per trajectory): `grad_sq_fn` runs right after each trajectory's
  backward, on the very `.grad` tensors vcpo then folds into its running sums; it finishes
  them in place, then returns the TP-reduced ‖g_i‖²;
- every other loss/advantage: the gradients of all trajectories accumulate unfinished (both
  reductions are linear) and `clip_fn` finishes them once, after vcpo's DP sum, before clipping.

Everything else (losses, advantages, ESS over the DP group, the lr rule, metrics) is vcpo's.
Gradients accumulate locally over all trajectories and are summed over DP once per step;
TP/CP ranks of one replica hold the same trajectories (all n samples of a prompt on one DP rank).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from agent_rl.learners.megatron.grads import ShardGroups, clip_grads, finish_backward, grad_sq_norm
from vcpo.exact import LogprobFn
from vcpo.step import Step, StepConfig


def sharded_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: StepConfig,
    *,
    groups: ShardGroups,
    logprob_fn: LogprobFn,
) -> Step:
    """A vcpo.Step whose gradients, norms and clipping are those of the full (unsharded) model."""
    if cfg.advantage == "opob" and cfg.opob_mode != "exact":
        raise ValueError(
            "algorithm.opob_mode=proxy is not available on the Megatron learner (its logit-gradient proxy "
            "needs the full vocabulary on one rank); use opob_mode: exact"
        )
    # ghost norms (vcpo/ghost.py) see nn.Linear layers, not Megatron's TP-sharded ones, and would need their
    # shares summed over TP with duplicates counted once: not built, so exact OPOB here backs up each trajectory
    cfg = dataclasses.replace(cfg, opob_norms="backward")
    params = [p for p in module.parameters() if p.requires_grad]

    def trajectory_grad_sq(_grads: list[Tensor]) -> float:
        finish_backward(params, groups)  # in place: vcpo accumulates these same tensors next
        return grad_sq_norm(params, [p.grad for p in params], groups)

    return Step(
        module,
        optimizer,
        cfg,
        dp_group=groups.dp,
        logprob_fn=logprob_fn,
        grad_sq_fn=trajectory_grad_sq,
        clip_fn=lambda _params, max_norm: clip_grads(params, max_norm, groups),
        finish_fn=lambda _params: finish_backward(params, groups),
    )
