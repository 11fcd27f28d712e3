"""megatron-core's MoE layer for Qwen3-MoE models, and rollout routing replay in it.

The sparse layers of a Qwen3-MoE model (`shape.MoEShape`) run megatron's own `MoELayer` from its local
layer spec: `TopKRouter` (softmax score function, logits in fp32), the allgather token dispatcher and
`SequentialMLP` (one plain-torch SwiGLU MLP per expert; the grouped-GEMM experts need Transformer Engine or
`grouped_gemm` and are not used). `moe_config` sets the TransformerConfig fields that reproduce
transformers' `Qwen3MoeSparseMoeBlock`:

- `norm_topk_prob: true` -> `moe_router_pre_softmax=False`: top-k of the logits, softmax over those k, i.e.
  softmax over all experts renormalised over the chosen k (transformers' order of operations);
- `norm_topk_prob: false` -> `moe_router_pre_softmax=True`: softmax over all experts, top-k of it;
- no load-balancing or z-loss term in the gradient (`moe_router_load_balancing_type="none"`): during RL the
  router moves only through the policy gradient, as in the torch learner; the load-balancing loss is logged
  (`learner/moe_aux_loss`), not trained on. No token dropping (no capacity factor), no expert bias.

Routing replay (`algorithm.routing_replay: rollout`) and `rollout/routing_agreement` use the torch learner's
`routing_replay.RoutingReplay` (the records, the rows in scope, the statistics): each router's
`router_replay` attribute, the hook megatron's `topk_routing_with_score_function` calls for its top-k,
becomes a `_LayerRoutes` that computes the router's own top-k (agreement), then returns the recorded
experts with the gate scores gathered at them, as megatron's own `RouterReplay` in REPLAY_FORWARD does;
megatron then softmaxes those scores (or, pre-softmax, takes them as they are), so the gates keep their
gradient into the router. megatron's `RouterReplay` itself is not used: it replays one global list of
per-layer tensors in the order the routers run and cannot say whether the router's own choice agreed.
Activation recompute re-runs a layer in the backward pass, after the forward's scope closed: the layer then
replays what its last forward used (megatron's recompute runs that forward without grad, so it is kept
whatever the grad mode).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from agent_rl.learners.megatron.shape import MoEShape
from agent_rl.learners.routing_replay import RoutingReplay


def moe_config(moe: MoEShape) -> dict:
    """TransformerConfig fields of a Qwen3-MoE model's sparse layers (expert and tensor parallel size 1)."""
    return {
        "num_moe_experts": moe.experts,
        "moe_router_topk": moe.top_k,
        "moe_ffn_hidden_size": moe.ffn_hidden,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not moe.norm_topk_prob,
        "moe_router_dtype": "fp32",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "allgather",
        "moe_grouped_gemm": False,
        "moe_permute_fusion": False,
        "moe_router_fusion": False,
        "expert_model_parallel_size": 1,
    }


def patch_missing_te_names() -> None:
    """megatron-core 0.16.1's moe_utils imports `te_general_gemm` (and the fused top-k) only when Transformer
    Engine imports, yet `RouterGatingLinearFunction` reads `te_general_gemm` unconditionally: without TE the
    router's forward raises `NameError: name 'te_general_gemm' is not defined` (moe_utils.py:1192). Binding the
    missing names to None selects megatron's own torch path (`torch.mm` in the router dtype). Idempotent."""
    from megatron.core.transformer.moe import moe_utils

    for name in ("te_general_gemm", "fused_topk_with_score_function"):
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def routers_of(model: nn.Module) -> dict[int, nn.Module]:
    """Decoder layer index (0-based) -> megatron TopKRouter of that layer's MoE MLP."""
    from megatron.core.transformer.moe.router import TopKRouter

    return {int(m.layer_number) - 1: m for m in model.modules() if isinstance(m, TopKRouter)}


def attach_routing(model: nn.Module, moe: MoEShape, *, replay: bool, seq_major: bool) -> RoutingReplay:
    """A RoutingReplay driving the routers of `model` (`step`/`rows` scopes as in the torch learner).
    `seq_major`: the rows run right-padded ([S, B] flattened, megatron's layout) rather than packed."""
    routing = RoutingReplay({}, layers=len(moe.sparse), replay=replay, top_k=moe.top_k, seq_major=seq_major)
    routers = routers_of(model)
    if sorted(routers) != [i for i, s in enumerate(moe.sparse) if s]:
        raise ValueError(
            f"megatron model routers at layers {sorted(routers)}; the HF config's sparse layers are {moe.sparse}"
        )
    for layer, router in routers.items():
        router.router_replay = _LayerRoutes(
            routing, layer, pre_softmax=bool(router.config.moe_router_pre_softmax)
        )
    return routing


class _LayerRoutes:
    """What megatron's TopKRouter calls for its top-k (the `router_replay` protocol: `get_replay_topk`)."""

    def __init__(self, routing: RoutingReplay, layer: int, *, pre_softmax: bool):
        self.routing, self.layer, self.pre_softmax = routing, layer, pre_softmax

    def get_replay_topk(
        self,
        scores: Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: Callable[..., tuple[Tensor, Tensor]] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(gate scores at the experts used, experts) for `scores` [n, E] (logits, or probabilities pre-softmax)."""
        own_scores, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        r = self.routing
        if (
            not r.in_scope
        ):  # a layer re-run by activation recompute in the backward pass: what its forward used
            used = r.recomputed(self.layer, own.shape[0])
        else:
            with torch.no_grad():
                probs = scores.float() if self.pre_softmax else scores.float().softmax(-1)
            used = r.choose(self.layer, probs, own)
            if used is None:
                raise RuntimeError(
                    f"MoE layer {self.layer}: the router saw {scores.shape[0]} tokens, which are neither the rows in "
                    "scope padded nor packed (packing with parallel padding is not supported with MoE)"
                )
            if r.replay:
                r.remember(self.layer, used)
        if used is None or not r.replay:
            return own_scores, own
        return scores.gather(1, used), used
