"""Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5, with its recurrent state in the cache.

Per layer and token (transformers' `Qwen3NextGatedDeltaNet` / `Qwen3_5GatedDeltaNet`): project x to q, k, v
(one `conv_dim` = 2·key_dim + value_dim channel block), a gate z and per-value-head b, a; run q|k|v through a
causal depthwise conv1d (kernel K, no bias) and SiLU; β = sigmoid(b), g = -exp(A_log) · softplus(a + dt_bias);
then the gated delta rule over the sequence with a [heads, d_k, d_v] state S per value head
(q, k L2-normalised, q scaled by d_k^-½):  S ← S·exp(g);  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq.
The output is RMS-normalised per head, multiplied by SiLU(z) (RMSNormGated), and projected out.

Qwen3-Next projects q|k|v|z with one matrix whose rows are grouped by key head (`in_proj_qkvz`, and b|a by
`in_proj_ba`); Qwen3.5 uses four plain matrices (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`).

What a request carries from step to step (`LinearStates`, one per slot, like the KV cache): the last K-1
conv inputs and the fp32 state S, as transformers' cache holds them. Unlike keys, a state exists only at
the end of what was fed, so a cached slot can serve a new prompt only when the prompt extends the slot's
tokens exactly (the continuation of a turn or of an aborted request: `usable_prefix` in sparse.py).

A prefill packs the rows' real tokens into one sequence, each row a document that starts from its own slot's
conv inputs and state (zeros for a fresh prompt), and runs agent_rl.varlen_delta_rule's conv and chunked rule
over it: the kernels the torch learner runs on its packed micro-batches (so a prompt's prefill computes what the
learner computes for it), no work on padding, and no state crossing from one row into the next. A one-token
decode step runs transformers' `torch_recurrent_gated_delta_rule`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from agent_rl.engines.embedded.shapes import ModelConfig, Step


@dataclass(frozen=True)
class LinearConfig:
    """The linear-attention part of a Qwen3-Next / Qwen3.5 config.json."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    layout: Literal[
        "qkvz", "split"
    ]  # Qwen3-Next's grouped in_proj_qkvz/in_proj_ba, or Qwen3.5's four matrices

    @classmethod
    def from_config(cls, c: dict, arch: str) -> LinearConfig:
        return cls(
            c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
            c["linear_value_head_dim"], c["linear_conv_kernel_dim"],
            "qkvz" if arch == "Qwen3NextForCausalLM" else "split",
        )  # fmt: skip

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


class LinearStates:
    """Per linear layer: conv inputs [slots, conv_dim, K-1] (model dtype) and the state [slots, Hv, dk, dv] fp32."""

    def __init__(self, *, layers: int, slots: int, cfg: LinearConfig, dtype: torch.dtype):
        self.conv = [
            torch.zeros(slots, cfg.conv_dim, cfg.conv_kernel - 1, dtype=dtype) for _ in range(layers)
        ]
        self.state = [
            torch.zeros(slots, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, dtype=torch.float32)
            for _ in range(layers)
        ]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.state))

    def swap(self, a: int, b: int) -> None:
        if a == b:
            return
        for buf in (*self.conv, *self.state):
            tmp = buf[a].clone()
            buf[a] = buf[b]
            buf[b] = tmp


class GatedRMSNorm(nn.Module):
    """transformers' RMSNormGated: w · rmsnorm(x) (in x's dtype) times SiLU(gate) computed in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """`model.layers.{i}.linear_attn`; `forward(x, residual, step, cache)` with cache.linear[index] its state."""

    def __init__(self, cfg: ModelConfig, lin: LinearConfig, index: int):
        super().__init__()
        self.lin, self.index, self.eps = lin, index, cfg.rms_norm_eps
        h, r = cfg.hidden_size, lin.num_v_heads // lin.num_k_heads
        if lin.layout == "qkvz":
            self.in_proj_qkvz = nn.Linear(h, 2 * lin.key_dim + 2 * lin.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(h, 2 * lin.num_v_heads, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(h, lin.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(h, lin.value_dim, bias=False)
            self.in_proj_b = nn.Linear(h, lin.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(h, lin.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(lin.conv_dim, lin.conv_dim, lin.conv_kernel, groups=lin.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(lin.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(lin.num_v_heads))
        self.norm = GatedRMSNorm(lin.head_v_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(lin.value_dim, h, bias=False)
        self.ratio = r

    def fuse(self) -> None:
        from agent_rl.engines.embedded.fused import Fused

        if self.lin.layout == "qkvz":
            self.proj = Fused([self.in_proj_qkvz, self.in_proj_ba])
        else:
            self.proj = Fused([self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a])
        self.out = Fused([self.out_proj])

    def _project(self, x: torch.Tensor, b: int, s: int):
        """(q|k|v [B, S, conv_dim], z [B, S, Hv, dv], b [B, S, Hv], a [B, S, Hv]) in transformers' order."""
        lin, r = self.lin, self.ratio
        p = self.proj(x).view(b, s, -1)
        if lin.layout == "split":
            qkv, z, beta, a = p.split([lin.conv_dim, lin.value_dim, lin.num_v_heads, lin.num_v_heads], dim=-1)
            return qkv, z.reshape(b, s, lin.num_v_heads, lin.head_v_dim), beta, a
        # Qwen3-Next: per key head [q (dk) | k (dk) | v (r·dv) | z (r·dv)], then per key head [b (r) | a (r)]
        nk, dk, dv = lin.num_k_heads, lin.head_k_dim, lin.head_v_dim
        qkvz, ba = p.split([2 * lin.key_dim + 2 * lin.value_dim, 2 * lin.num_v_heads], dim=-1)
        q, k, v, z = qkvz.view(b, s, nk, -1).split([dk, dk, r * dv, r * dv], dim=-1)
        beta, a = ba.view(b, s, nk, 2 * r).split([r, r], dim=-1)
        qkv = torch.cat([q.reshape(b, s, -1), k.reshape(b, s, -1), v.reshape(b, s, -1)], dim=-1)
        return qkv, z.reshape(b, s, -1, dv), beta.reshape(b, s, -1), a.reshape(b, s, -1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, step: Step, cache) -> torch.Tensor:
        assert step.positions is not None and step.last is not None
        lin, b, s = self.lin, step.batch, step.seq
        states = cache.linear
        rows = slice(step.start, step.start + b)
        fresh = (step.positions[:, 0] == 0)[:, None, None]  # rows starting a sequence: zero state
        qkv, z, beta, a = self._project(x, b, s)
        conv_prev = states.conv[self.index][rows].masked_fill(fresh, 0)  # [B, C, K-1]
        state_prev = states.state[self.index][rows].masked_fill(fresh[..., None], 0.0)
        if s == 1:
            out = self._decode(qkv, beta, a, conv_prev, state_prev, rows, states)
        else:
            out = self._prefill(qkv, beta, a, conv_prev, state_prev, rows, states, step)
        out = self.norm(out.reshape(-1, lin.head_v_dim), z.reshape(-1, lin.head_v_dim))
        return self.out(out.reshape(b * s, lin.value_dim), residual)

    def _gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return b.sigmoid(), -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)

    def _decode(self, qkv, beta, a, conv_prev, state_prev, rows, states) -> torch.Tensor:
        """One token per row: the conv over [the last K-1 inputs | this one], the recurrent step."""
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

        lin, b = self.lin, qkv.shape[0]
        seq = torch.cat([conv_prev, qkv.transpose(1, 2)], dim=-1)  # [B, C, K]
        mixed = F.silu(F.conv1d(seq.to(self.conv1d.weight.dtype), self.conv1d.weight, groups=lin.conv_dim))
        states.conv[self.index][rows] = seq[:, :, 1:]
        q, k, v = mixed.to(qkv.dtype).transpose(1, 2).split([lin.key_dim, lin.key_dim, lin.value_dim], dim=-1)
        beta, g = self._gates(beta, a)
        out, final = torch_recurrent_gated_delta_rule(
            q.reshape(b, 1, lin.num_k_heads, lin.head_k_dim), k.reshape(b, 1, lin.num_k_heads, lin.head_k_dim),
            v.reshape(b, 1, lin.num_v_heads, lin.head_v_dim), g=g, beta=beta, initial_state=state_prev,
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        states.state[self.index][rows] = final
        return out

    def _prefill(self, qkv, beta, a, conv_prev, state_prev, rows, states, step: Step) -> torch.Tensor:
        """The rows' real tokens packed into one sequence, each row a document starting from its own slot's conv
        inputs and state (zeros for a fresh one): agent_rl.varlen_delta_rule, the kernels the torch learner runs
        on its packed micro-batches, so a prompt's prefill computes what the learner computes for it."""
        from agent_rl.varlen_delta_rule import causal_conv1d_varlen, chunk_gated_delta_rule_varlen

        assert step.last is not None
        lin, (b, s) = self.lin, qkv.shape[:2]
        lengths = (step.last + 1).tolist()
        bounds = tuple(itertools.accumulate(lengths, initial=0))
        real = torch.cat(
            [torch.arange(n) + i * s for i, n in enumerate(lengths)]
        )  # rows' real tokens in [B*S]
        packed = qkv.reshape(b * s, -1)[real]
        mixed, last_inputs = causal_conv1d_varlen(packed, self.conv1d.weight[:, 0], bounds, conv_prev)
        states.conv[self.index][rows] = last_inputs
        q, k, v = F.silu(mixed).split([lin.key_dim, lin.key_dim, lin.value_dim], dim=-1)
        beta, g = self._gates(beta.reshape(b * s, -1)[real], a.reshape(b * s, -1)[real])
        out, final = chunk_gated_delta_rule_varlen(
            q.reshape(-1, lin.num_k_heads, lin.head_k_dim), k.reshape(-1, lin.num_k_heads, lin.head_k_dim),
            v.reshape(-1, lin.num_v_heads, lin.head_v_dim), g, beta, bounds, initial_state=state_prev,
        )  # fmt: skip
        states.state[self.index][rows] = final
        # padding positions: zeros (their outputs are never read)
        return out.new_zeros(b * s, lin.num_v_heads, lin.head_v_dim).index_copy_(0, real, out)
