"""Hugging Face <-> Megatron weights of one Qwen3-MoE sparse MLP (megatron's MoE layer with SequentialMLP experts).

transformers (5.x) holds a sparse block's experts fused: `mlp.experts.gate_up_proj` [E, 2I, H] (each
expert's gate rows, then its up rows) and `mlp.experts.down_proj` [E, H, I]; the router is `mlp.gate.weight`
[E, H]. megatron's local MoE layer holds one MLP per expert, `mlp.experts.local_experts.{e}.linear_fc1` [2I, H]
as `[gate; up]` (the same layout as one slice of gate_up_proj) and `linear_fc2` [H, I], and the router as
`mlp.router.weight`. Expert and tensor parallelism are 1 (the config refuses more for MoE models), so every
tensor moves whole. No megatron import: the converter's round trip is tested without a model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from agent_rl.learners.megatron.shape import MoEShape

Tensors = dict[str, torch.Tensor]


def moe_hf_to_megatron(hf: Mapping[str, torch.Tensor], h: str, m: str, moe: MoEShape) -> Tensors:
    """Megatron tensors of HF layer prefix `h` ("model.layers.i") under megatron prefix `m` ("decoder.layers.i")."""
    gate_up, down = hf[f"{h}.mlp.experts.gate_up_proj"], hf[f"{h}.mlp.experts.down_proj"]
    want = {"gate_up_proj": (moe.experts, 2 * moe.ffn_hidden), "down_proj": (moe.experts,)}
    for name, t in (("gate_up_proj", gate_up), ("down_proj", down)):
        if tuple(t.shape[: len(want[name])]) != want[name]:
            raise ValueError(
                f"HF->Megatron: {h}.mlp.experts.{name} has shape {tuple(t.shape)}; expected {want[name]}+"
            )
    out: Tensors = {f"{m}.mlp.router.weight": hf[f"{h}.mlp.gate.weight"].clone()}
    for e in range(moe.experts):
        x = f"{m}.mlp.experts.local_experts.{e}"
        out[f"{x}.linear_fc1.weight"] = gate_up[e].clone()
        out[f"{x}.linear_fc2.weight"] = down[e].clone()
    return out


def moe_megatron_to_hf(mg: Mapping[str, torch.Tensor], h: str, m: str, moe: MoEShape) -> Tensors:
    """The HF tensors (fused experts, as a transformers model's state_dict holds them) of one sparse layer."""
    x = f"{m}.mlp.experts.local_experts"
    return {
        f"{h}.mlp.gate.weight": mg[f"{m}.mlp.router.weight"].clone(),
        f"{h}.mlp.experts.gate_up_proj": torch.stack(
            [mg[f"{x}.{e}.linear_fc1.weight"] for e in range(moe.experts)]
        ),
        f"{h}.mlp.experts.down_proj": torch.stack(
            [mg[f"{x}.{e}.linear_fc2.weight"] for e in range(moe.experts)]
        ),
    }
