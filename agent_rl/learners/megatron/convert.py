"""Hugging Face <-> Megatron weights: name mapping, QKV/SwiGLU re-layout, TP sharding and gathering.

Megatron stores Q, K and V of one KV group next to each other (`[q heads of group g; k_g; v_g]`
for every group g) in a single `linear_qkv`, and gate and up projections as `[gate; up]` in
`linear_fc1`; tensor parallelism then splits whole groups / the two halves separately. The pure
functions `hf_to_megatron` (one rank's shard) and `megatron_to_hf` (merge of all shards) are
exact inverses (a Qwen3-MoE model's sparse MLPs: `moe_convert.py`); `load_hf_into_megatron` and `gather_hf_state_dict` apply them to a live model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from agent_rl.learners.megatron.moe_convert import moe_hf_to_megatron, moe_megatron_to_hf
from agent_rl.learners.megatron.shape import ModelShape

Tensors = dict[str, torch.Tensor]


def _norm_names(i: int, te: bool) -> tuple[str, str]:
    """Megatron names of a layer's two norms: TE fuses them into the following linear."""
    p = f"decoder.layers.{i}"
    if te:
        return f"{p}.self_attention.linear_qkv.layer_norm_weight", f"{p}.mlp.linear_fc1.layer_norm_weight"
    return f"{p}.input_layernorm.weight", f"{p}.pre_mlp_layernorm.weight"


def shard_dim(name: str) -> int | None:
    """The dimension TP splits a Megatron parameter along; None for replicated ones (norms)."""
    if name.endswith(("word_embeddings.weight", "linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight")):
        return 0
    if name == "output_layer.weight":
        return 0
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return None


def _qkv_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: ModelShape) -> torch.Tensor:
    """[q; k; v] rows in HF order -> Megatron's per-group interleave, rows [groups * (hpg + 2) * d, ...]."""
    d, g, hpg = s.head_dim, s.kv_heads, s.heads_per_group
    tail = q.shape[1:]
    q = q.reshape(g, hpg * d, *tail)
    k = k.reshape(g, d, *tail)
    v = v.reshape(g, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(g * (hpg + 2) * d, *tail)


def _qkv_split(qkv: torch.Tensor, s: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d, g, hpg = s.head_dim, s.kv_heads, s.heads_per_group
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *tail)
    q, k, v = grouped.split([hpg * d, d, d], dim=1)
    return q.reshape(g * hpg * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail)


def hf_to_megatron(
    hf: Mapping[str, torch.Tensor], s: ModelShape, *, tp_rank: int, tp_size: int, te: bool
) -> Tensors:
    """This TP rank's Megatron parameters from a full HF state dict (copies; HF tensors are not modified)."""
    s.check_tp(tp_size)

    def shard(t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.chunk(tp_size, dim=dim)[tp_rank].clone()

    out: Tensors = {"embedding.word_embeddings.weight": shard(hf["model.embed_tokens.weight"], 0)}
    for i in range(s.layers):
        h, m = f"model.layers.{i}", f"decoder.layers.{i}"
        attn_norm, mlp_norm = _norm_names(i, te)
        out[attn_norm] = hf[f"{h}.input_layernorm.weight"].clone()
        out[mlp_norm] = hf[f"{h}.post_attention_layernorm.weight"].clone()
        a = f"{h}.self_attn"
        out[f"{m}.self_attention.linear_qkv.weight"] = shard(
            _qkv_grouped(hf[f"{a}.q_proj.weight"], hf[f"{a}.k_proj.weight"], hf[f"{a}.v_proj.weight"], s), 0
        )
        if s.qkv_bias:
            out[f"{m}.self_attention.linear_qkv.bias"] = shard(
                _qkv_grouped(hf[f"{a}.q_proj.bias"], hf[f"{a}.k_proj.bias"], hf[f"{a}.v_proj.bias"], s), 0
            )
        out[f"{m}.self_attention.linear_proj.weight"] = shard(hf[f"{a}.o_proj.weight"], 1)
        if s.qk_norm:  # per-head norms: the same weight on every TP rank
            out[f"{m}.self_attention.q_layernorm.weight"] = hf[f"{a}.q_norm.weight"].clone()
            out[f"{m}.self_attention.k_layernorm.weight"] = hf[f"{a}.k_norm.weight"].clone()
        if s.moe is not None and s.moe.sparse[i]:  # megatron's MoE layer (moe.py), tp = 1
            out |= moe_hf_to_megatron(hf, h, m, s.moe)
            continue
        gate, up = shard(hf[f"{h}.mlp.gate_proj.weight"], 0), shard(hf[f"{h}.mlp.up_proj.weight"], 0)
        out[f"{m}.mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[f"{m}.mlp.linear_fc2.weight"] = shard(hf[f"{h}.mlp.down_proj.weight"], 1)
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
    if not s.tie_embeddings:
        out["output_layer.weight"] = shard(hf["lm_head.weight"], 0)
    return out


def megatron_to_hf(shards: Sequence[Mapping[str, torch.Tensor]], s: ModelShape, *, te: bool) -> Tensors:
    """Full HF state dict from the parameters of every TP rank, in rank order."""

    def cat(name: str, dim: int) -> torch.Tensor:
        return torch.cat([sh[name] for sh in shards], dim=dim)

    first = shards[0]
    out: Tensors = {"model.embed_tokens.weight": cat("embedding.word_embeddings.weight", 0)}
    for i in range(s.layers):
        h, m = f"model.layers.{i}", f"decoder.layers.{i}"
        attn_norm, mlp_norm = _norm_names(i, te)
        out[f"{h}.input_layernorm.weight"] = first[attn_norm].clone()
        out[f"{h}.post_attention_layernorm.weight"] = first[mlp_norm].clone()
        a = f"{h}.self_attn"
        for kind in ("weight", "bias") if s.qkv_bias else ("weight",):
            q, k, v = _qkv_split(cat(f"{m}.self_attention.linear_qkv.{kind}", 0), s)
            out[f"{a}.q_proj.{kind}"], out[f"{a}.k_proj.{kind}"], out[f"{a}.v_proj.{kind}"] = q, k, v
        out[f"{a}.o_proj.weight"] = cat(f"{m}.self_attention.linear_proj.weight", 1)
        if s.qk_norm:
            out[f"{a}.q_norm.weight"] = first[f"{m}.self_attention.q_layernorm.weight"].clone()
            out[f"{a}.k_norm.weight"] = first[f"{m}.self_attention.k_layernorm.weight"].clone()
        if s.moe is not None and s.moe.sparse[i]:
            out |= moe_megatron_to_hf(first, h, m, s.moe)
            continue
        halves = [sh[f"{m}.mlp.linear_fc1.weight"].chunk(2, dim=0) for sh in shards]
        out[f"{h}.mlp.gate_proj.weight"] = torch.cat([g for g, _ in halves], dim=0)
        out[f"{h}.mlp.up_proj.weight"] = torch.cat([u for _, u in halves], dim=0)
        out[f"{h}.mlp.down_proj.weight"] = cat(f"{m}.mlp.linear_fc2.weight", 1)
    out["model.norm.weight"] = first["decoder.final_layernorm.weight"].clone()
    out["lm_head.weight"] = (
        out["model.embed_tokens.weight"] if s.tie_embeddings else cat("output_layer.weight", 0)
    )
    return out


def named_parameters(params: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{megatron name: parameter} of a model, or the mapping itself (e.g. `MainParams.named()`)."""
    return dict(params) if isinstance(params, Mapping) else dict(params.named_parameters())


def load_hf_into_megatron(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    hf: Mapping[str, torch.Tensor],
    s: ModelShape,
    *,
    tp_rank: int,
    tp_size: int,
    te: bool,
) -> None:
    """Copy an HF state dict into this rank's live Megatron shard (a model, or {megatron name: parameter});
    every parameter must be covered exactly.

    Also sets megatron's `tensor_model_parallel` / `partition_dim` attributes, which megatron-core
    0.16 leaves unset on weights built with `perform_initialization=False`; the gradient norm
    (TP-duplicates counted once) depends on them.
    """
    local = hf_to_megatron(hf, s, tp_rank=tp_rank, tp_size=tp_size, te=te)
    params = named_parameters(model)
    missing, unexpected = sorted(set(params) - set(local)), sorted(set(local) - set(params))
    if missing or unexpected:
        raise KeyError(
            f"HF->Megatron name mismatch: model params without HF source {missing}; unused {unexpected}"
        )
    with torch.no_grad():
        for name, p in params.items():
            src = local[name]
            if src.shape != p.shape:
                raise ValueError(
                    f"HF->Megatron: {name} has shape {tuple(p.shape)}, converted {tuple(src.shape)}"
                )
            p.copy_(src.to(dtype=p.dtype, device=p.device))
            dim = shard_dim(name)
            p.tensor_model_parallel = dim is not None  # type: ignore[attr-defined]
            p.partition_dim = -1 if dim is None else dim  # type: ignore[attr-defined]
            p.partition_stride = 1  # type: ignore[attr-defined]


def gather_hf_state_dict(
    model: torch.nn.Module | Mapping[str, torch.Tensor], s: ModelShape, *, tp_group, te: bool
) -> Tensors:
    """All TP shards gathered (every TP rank gets the result), converted to HF names, on the CPU."""
    import torch.distributed as dist

    tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    shards: list[Tensors] = [{} for _ in range(tp_size)]
    for name, p in named_parameters(model).items():
        t = p.detach()
        if tp_size > 1 and shard_dim(name) is not None:
            parts = [torch.empty_like(t) for _ in range(tp_size)]
            dist.all_gather(parts, t.contiguous(), group=tp_group)
        else:
            parts = [t] * tp_size
        for r, part in enumerate(parts):
            shards[r][name] = part.cpu()
    return megatron_to_hf(shards, s, te=te)
