"""vcpo.Step on a Megatron model-parallel shard: vcpo's own math, with TP/SP/CP-aware gradient hooks.

vcpo.Step sees gradients as whole-model tensors. On a TP x CP shard they must first be
*finished* (`grads.finish_backward`: sequence-parallel norm gradients summed over TP,
gradients averaged over CP), and norms must be reduced over TP with TP-duplicates counted
once (`grads.grad_sq_norm`). Both go through vcpo's hooks:

- exact OPOB (one backward per trajectory): `grad_sq_fn` runs right after each trajectory's
  backward, on the very `.grad` tensors vcpo then folds into its running sums; it finishes
  them in place, then returns the TP-reduced ‖g_i‖²;
- exact OPOB from ghost norms (algorithm.opob_norms: ghost): `ghost.MegatronGhostNorms` forms every
  ‖g_i‖² of a micro-batch from its layers' inputs and output gradients, reduced over TP, and the one
  weighted backward's gradients are finished by `finish_fn` like the micro-batched losses';
- every other loss/advantage: the gradients of all trajectories accumulate unfinished (both
  reductions are linear) and `clip_fn` finishes them once, after vcpo's DP sum, before clipping.

Everything else (losses, advantages, ESS over the DP group, the lr rule, metrics) is vcpo's.
Gradients accumulate locally over all trajectories and are summed over DP once per step;
TP/CP ranks of one replica hold the same trajectories (all n samples of a prompt on one DP rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from agent_rl.learners.megatron.grads import ShardGroups, clip_grads, finish_backward, grad_sq_norm
from vcpo.exact import LogprobFn
from vcpo.step import Step, StepConfig

if TYPE_CHECKING:
    from agent_rl.learners.megatron.ghost import MegatronGhostNorms


def sharded_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: StepConfig,
    *,
    groups: ShardGroups,
    logprob_fn: LogprobFn,
    ghost_norms: Callable[[], MegatronGhostNorms] | None = None,
) -> Step:
    """A vcpo.Step whose gradients, norms and clipping are those of the full (unsharded) model. `ghost_norms`
    builds the TP-aware ghost hooks (ghost.py) for opob_norms='ghost'."""
    if cfg.advantage == "opob" and cfg.opob_mode != "exact":
        raise ValueError(
            "algorithm.opob_mode=proxy is not available on the Megatron learner (its logit-gradient proxy "
            "needs the full vocabulary on one rank); use opob_mode: exact"
        )
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
        ghost_norms=ghost_norms,
    )
