"""Mixture-of-Experts MLP of Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE, and the record of where each token was routed.

The math is transformers' (`Qwen3MoeSparseMoeBlock`, `Qwen3NextSparseMoeBlock`): router logits = x W_gᵀ,
probabilities = softmax in fp32, the top-k experts by probability, their probabilities renormalised to sum
to 1 when `norm_topk_prob` (always for Qwen3.5-MoE), cast back to the activations' dtype; each chosen
expert is a SwiGLU MLP whose output is scaled by its weight and summed. Qwen3-Next and Qwen3.5-MoE add a
shared expert (a SwiGLU MLP every token goes through) scaled by sigmoid(x w_sᵀ).

Experts run batched per step: the step's (token, slot) pairs are sorted by expert once, and every expert
that received tokens runs one GEMM over all of them (not one call per token), as transformers'
eager experts do. Weights are kept under transformers' in-memory names and shapes
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I], `mlp.gate.weight` [E, H]):
that is what a learner's `state_dict()` pushes. A checkpoint on disk may hold one tensor per expert
(`mlp.experts.{e}.gate_proj.weight`, ...: the hub layout `save_pretrained` writes); `merge_experts` stacks
those. The storage is transposed (`[E, H, 2I]`), each parameter a view of it, for the same reason as
model.py's `Fused`.

`RoutingTable` keeps, per cache slot and position, the top-k expert ids every MoE layer chose for the
token fed there: prefill and decode write it, a slot swap moves it with the keys, and a finished request
reads rows 0 .. prompt + output - 2 (every position that was fed; the last sampled token never is):
SGLang's `return_routed_experts` layout ([positions, layers, top_k], -1 on layers without experts).
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from agent_rl.types import RoutedExperts

if TYPE_CHECKING:
    from agent_rl.engines.embedded.shapes import ModelConfig, Step


@dataclass(frozen=True)
class MoEConfig:
    """The sparse-MLP part of a Qwen MoE config.json."""

    num_experts: int
    top_k: int
    norm_topk_prob: bool
    intermediate_size: int  # per expert
    shared_intermediate_size: int  # 0: no shared expert (Qwen3-MoE)
    sparse_layers: frozenset[int]

    @classmethod
    def from_config(cls, c: dict, arch: str) -> MoEConfig | None:
        """None for a model without experts (Qwen3.5 dense)."""
        experts = c.get("num_experts", c.get("num_local_experts"))  # transformers 5 saves the latter name
        if arch == "Qwen3_5ForCausalLM" or not experts:
            return None
        n = c["num_hidden_layers"]
        if arch == "Qwen3_5MoeForCausalLM":  # every layer is sparse and always renormalises
            sparse, norm = frozenset(range(n)), True
        else:  # transformers' rule: not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
            only, step = set(c.get("mlp_only_layers") or ()), c.get("decoder_sparse_step", 1)
            sparse = frozenset(i for i in range(n) if i not in only and (i + 1) % step == 0)
            norm = c.get("norm_topk_prob", arch != "Qwen3MoeForCausalLM")  # the config classes' defaults
        shared = c.get("shared_expert_intermediate_size", 0) if arch != "Qwen3MoeForCausalLM" else 0
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"experts with hidden_act {c.get('hidden_act')!r}: only silu (SwiGLU) is supported"
            )
        return cls(experts, c["num_experts_per_tok"], bool(norm), c["moe_intermediate_size"], shared, sparse)


class RoutingTable:
    """Top-k expert ids per (slot, position, layer): int16, -1 where nothing was routed."""

    def __init__(self, *, slots: int, max_seq_len: int, layers: int, top_k: int):
        self.ids = torch.full((slots, max_seq_len, layers, top_k), -1, dtype=torch.int16)
        self.max_seq_len, self.layers, self.top_k = max_seq_len, layers, top_k

    @property
    def nbytes(self) -> int:
        return self.ids.numel() * self.ids.element_size()

    def write(self, layer: int, step: Step, experts: torch.Tensor) -> None:
        """experts: [B*S, k] ids of the rows' tokens at step.positions (rows = slots step.start ...)."""
        assert step.positions is not None
        rows = torch.arange(step.start, step.start + step.batch)[:, None] * self.max_seq_len
        flat = (rows + step.positions).reshape(-1)
        self.ids.view(-1, self.layers, self.top_k)[flat, layer] = experts.to(torch.int16)

    def read(self, slot: int, positions: int) -> RoutedExperts:
        """Rows 0..positions-1 of `slot` (copied)."""
        ids = array("h")
        ids.frombytes(self.ids[slot, : max(positions, 0)].contiguous().numpy().tobytes())
        return RoutedExperts(self.layers * self.top_k, ids)

    def fork(self, src: int, dst: int, length: int) -> None:
        self.ids[dst, :length] = self.ids[src, :length]

    def swap(self, a: int, b: int, length: int) -> None:
        if a == b or length <= 0:
            return
        tmp = self.ids[a, :length].clone()
        self.ids[a, :length] = self.ids[b, :length]
        self.ids[b, :length] = tmp


class Experts(nn.Module):
    """E SwiGLU experts as transformers stores them: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def fuse(self) -> None:
        """Transposed storage ([E, H, 2I], [E, I, H]) for `x @ W`; the parameters become views of it."""
        self.w_gate_up = self.gate_up_proj.detach().transpose(1, 2).contiguous()
        self.w_down = self.down_proj.detach().transpose(1, 2).contiguous()
        self.gate_up_proj = nn.Parameter(self.w_gate_up.transpose(1, 2), requires_grad=False)
        self.down_proj = nn.Parameter(self.w_down.transpose(1, 2), requires_grad=False)

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H]; experts, weights [N, k] -> Σ_j weights[:, j] · expert_{experts[:, j]}(x) [N, H]."""
        k = experts.shape[1]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.w_gate_up.shape[0]).tolist()
        token = order // k
        scale = weights.reshape(-1)[order, None]
        inputs = x[token]
        out = torch.zeros_like(x)
        at = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            gate, up = (inputs[at : at + n] @ self.w_gate_up[e]).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ self.w_down[e]
            out.index_add_(0, token[at : at + n], y * scale[at : at + n])
            at += n
        return out


class SharedExpert(nn.Module):
    """The shared expert's SwiGLU MLP (HF names gate_proj / up_proj / down_proj)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def fuse(self) -> None:
        from agent_rl.engines.embedded.fused import Fused

        self.gate_up, self.down = Fused([self.gate_proj, self.up_proj]), Fused([self.down_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """One sparse MLP (`model.layers.{i}.mlp`); `forward(x, residual, step, cache)` records the routing."""

    def __init__(self, cfg: ModelConfig, moe: MoEConfig, layer: int):
        super().__init__()
        self.layer, self.moe = layer, moe
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, cfg.hidden_size, moe.intermediate_size)
        if moe.shared_intermediate_size:
            self.shared_expert = SharedExpert(cfg.hidden_size, moe.shared_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def fuse(self) -> None:
        from agent_rl.engines.embedded.fused import Fused

        self.router = Fused([self.gate])
        self.experts.fuse()
        if self.moe.shared_intermediate_size:
            self.shared_expert.fuse()
            self.shared_gate = Fused([self.shared_expert_gate])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [N, k], their weights [N, k] in x's dtype), as transformers' TopKRouter."""
        logits = self.router(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.moe.top_k, dim=-1)
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(logits.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, step: Step, cache) -> torch.Tensor:
        experts, weights = self.route(x)
        if cache.routes is not None:
            cache.routes.write(self.layer, step, experts)
        out = self.experts(x, experts, weights)
        if self.moe.shared_intermediate_size:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared_expert(x)
        return residual + out


_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def merge_experts(state: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """Stack one-tensor-per-expert names into transformers' fused `gate_up_proj` / `down_proj` (others pass)."""
    found: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            found.setdefault(m[1], {})[(m[3], int(m[2]))] = t
    for prefix, parts in found.items():
        missing = [f"{prefix}.{e}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")
                   for e in range(num_experts) if (p, e) not in parts]  # fmt: skip
        if missing:
            raise ValueError(
                f"{prefix}: {len(missing)} per-expert tensors missing (e.g. {missing[0]}); experts are loaded "
                f"and updated as a whole layer ({num_experts} experts x gate/up/down), or send the fused "
                f"{prefix}.gate_up_proj and {prefix}.down_proj"
            )
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[("gate_proj", e)], parts[("up_proj", e)]]) for e in range(num_experts)]
        )
        out[f"{prefix}.down_proj"] = torch.stack([parts[("down_proj", e)] for e in range(num_experts)])
    return out
