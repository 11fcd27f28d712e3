"""Packed micro-batches for hybrid models (Qwen3-Next, Qwen3.5): Gated DeltaNet layers that keep documents apart.

transformers' Gated DeltaNet layers (`Qwen3NextGatedDeltaNet`, `Qwen3_5GatedDeltaNet`, Qwen3.5-MoE's) run their
short causal conv and the gated delta rule over the whole row: packed, the state of one trajectory would flow
into the next. Without flash-linear-attention their rule refuses the document bounds (`cu_seqlens`); with it the
rule takes them but the conv still runs across documents. So, when the learner packs a hybrid model,
`use_packed_linear_attention` gives each such layer (the instance, not the class) a forward that, given the
bounds of the packed documents (`packed_bounds` from `hf_logprobs`, or `cu_seq_lens_q` as FlashAttention names
them), projects as transformers does, then runs `agent_rl.varlen_delta_rule`'s conv and rule with a fresh state
at every document boundary (flash-linear-attention's varlen rule on CUDA when installed: not run here), and the
layer's own gated norm and output projection. Any other call (no bounds, a cache, a padding mask) goes to
transformers' forward unchanged. Parameter names do not change (checkpoints and weight pushes are unaffected).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agent_rl.varlen_delta_rule import (
    causal_conv1d_varlen,
    chunk_gated_delta_rule_varlen,
    fla_available,
    fla_chunk_gated_delta_rule,
)


def _is_gated_deltanet(module: nn.Module) -> bool:
    return type(module).__name__.endswith("GatedDeltaNet") and hasattr(module, "conv1d")


def use_packed_linear_attention(model: nn.Module) -> bool:
    """Give every Gated DeltaNet layer of `model` the document-aware forward; False (the model untouched) when a
    layer is not one this module knows (a conv with bias, an activation other than SiLU, an unknown layout)."""
    layers = [m for m in model.modules() if _is_gated_deltanet(m)]
    known = all(
        m.conv1d.bias is None
        and getattr(m, "activation", "silu") in ("silu", "swish")
        and (hasattr(m, "in_proj_qkvz") or hasattr(m, "in_proj_qkv"))
        for m in layers
    )
    if not layers or not known:
        return False
    for m in layers:
        if not hasattr(m, "_transformers_forward"):
            m._transformers_forward = m.forward
            m.forward = types.MethodType(_forward, m)
    return True


def _forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    cache: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    bounds = kwargs.get("packed_bounds")
    cu = kwargs.get("cu_seq_lens_q")
    if (bounds is None and cu is None) or cache is not None or attention_mask is not None:
        return self._transformers_forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    if hidden_states.shape[0] != 1:
        raise ValueError(f"packed documents come as one row, got a batch of {hidden_states.shape[0]}")
    bounds = tuple(bounds) if bounds is not None else tuple(int(b) for b in cu.tolist())
    return packed_forward(self, hidden_states[0], bounds)[None]


def packed_forward(layer: nn.Module, x: torch.Tensor, bounds: tuple[int, ...]) -> torch.Tensor:
    """A transformers Gated DeltaNet layer over the packed documents x [N, hidden] (bounds: where each ends)."""
    n = x.shape[0]
    dv = layer.head_v_dim
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: q|k|v|z and b|a grouped by key head
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(
            layer.in_proj_qkvz(x[None]), layer.in_proj_ba(x[None])
        )
        qkv = torch.cat([t.reshape(n, -1) for t in (q, k, v)], dim=-1)
        z, b, a = z.reshape(n, -1, dv), b.reshape(n, -1), a.reshape(n, -1)
    else:  # Qwen3.5: four plain projections
        qkv, z, b, a = (
            layer.in_proj_qkv(x),
            layer.in_proj_z(x).reshape(n, -1, dv),
            layer.in_proj_b(x),
            layer.in_proj_a(x),
        )
    mixed, _ = causal_conv1d_varlen(qkv, layer.conv1d.weight.squeeze(1), bounds)
    mixed = F.silu(mixed)
    q, k, v = mixed.split([layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q, k = q.reshape(n, -1, layer.head_k_dim), k.reshape(n, -1, layer.head_k_dim)
    v = v.reshape(n, -1, dv)
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)  # as transformers (fp32 decay)
    rule = fla_chunk_gated_delta_rule if fla_available() and x.is_cuda else chunk_gated_delta_rule_varlen
    out, _ = rule(q, k, v, g, beta, bounds)
    out = layer.norm(out.reshape(-1, dv), z.reshape(-1, dv)).reshape(n, -1)
    return layer.out_proj(out)
