"""Qwen3-MoE, Qwen3-Next and Qwen3.5 (dense and MoE) on model.py's decoder: sparse MLPs, hybrid token mixers.

- **Qwen3MoeForCausalLM**: Qwen3's attention (q/k norms, RoPE) with a sparse MLP (moe.py) on the layers
  transformers makes sparse (`decoder_sparse_step`, `mlp_only_layers`), a dense SwiGLU elsewhere.
- **Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM**: `layer_types` interleaves Gated
  DeltaNet layers (linear_attention.py) with *gated* full attention: q_proj also yields a per-head gate
  (sigmoid(gate) scales the attention output), RoPE covers the first `partial_rotary_factor` of each
  head, and every RMSNorm but the DeltaNet output norm scales by (1 + w) (weights stored zero-centred),
  computed in fp32 and cast once. Qwen3.5's text rotary is multimodal RoPE, which for text (one position
  id on all three axes) is the plain RoPE used here.

The cache (`SparseCache`) holds keys/values of the full-attention layers only, the recurrent state of
the linear ones, and the routing table of the sparse MLPs. With linear layers, a slot's cache serves a
new prompt only when the prompt extends the slot's tokens exactly (see linear_attention.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from agent_rl.engines.embedded.cache import KVCache
from agent_rl.engines.embedded.linear_attention import GatedDeltaNet, LinearConfig, LinearStates
from agent_rl.engines.embedded.model import MLP, Attention, CausalLM, Fused, ModelConfig, RMSNorm, Step
from agent_rl.engines.embedded.moe import MoEConfig, RoutingTable, SparseMoE, merge_experts

HYBRID = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")


@dataclass(frozen=True)
class SparseSpec:
    """What config.json adds to ModelConfig for these architectures."""

    layer_types: tuple[str, ...]  # "full_attention" | "linear_attention" per layer
    moe: MoEConfig | None
    linear: LinearConfig | None
    rotary_dim: int  # RoPE covers head_dim[:rotary_dim]
    hybrid: bool  # gated attention, (1 + w) norms

    @classmethod
    def read(cls, model_dir: str | Path, cfg: ModelConfig) -> SparseSpec:
        path = Path(model_dir) / "config.json"
        c = json.loads(path.read_text())
        arch, n = cfg.architecture, cfg.num_layers
        hybrid = arch in HYBRID
        try:
            moe = MoEConfig.from_config(c, arch)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None
        if not hybrid:
            if c.get("use_sliding_window"):
                raise ValueError(f"{path}: use_sliding_window is not supported")
            return cls(("full_attention",) * n, moe, None, cfg.head_dim, False)
        types = tuple(c.get("layer_types") or ())
        if not types:  # transformers' default: every full_attention_interval-th layer is full attention
            every = c.get("full_attention_interval", 4)
            types = tuple("full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n))
        if len(types) != n or set(types) - {"full_attention", "linear_attention"}:
            raise ValueError(
                f"{path}: layer_types must name full_attention or linear_attention for each of {n} layers"
            )
        rope = c.get("rope_parameters") or {}
        factor = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
        rotary = int(cfg.head_dim * factor)
        if rotary % 2 or not 0 < rotary <= cfg.head_dim:
            raise ValueError(f"{path}: partial_rotary_factor {factor} gives an odd or empty rotary dimension")
        return cls(types, moe, LinearConfig.from_config(c, arch), rotary, True)


class OffsetRMSNorm(nn.Module):
    """Qwen3-Next / Qwen3.5 RMSNorm: rmsnorm(x) · (1 + w), all in fp32, cast to x's dtype once."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class GatedAttention(nn.Module):
    """Qwen3-Next's full attention: q_proj gives [query | gate] per head; partial RoPE; (1 + w) q/k norms."""

    def __init__(self, cfg: ModelConfig, rotary_dim: int, index: int):
        super().__init__()
        self.cfg, self.rotary_dim, self.index = cfg, rotary_dim, index
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d * 2, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)

    def fuse(self) -> None:
        self.qkv, self.o = Fused([self.q_proj, self.k_proj, self.v_proj]), Fused([self.o_proj])

    def _rope(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """RoPE on the first rotary_dim channels of each head (x: [B, S, heads, d])."""
        r = self.rotary_dim
        rot, keep = x[..., :r], x[..., r:]
        flipped = rot.unflatten(-1, (2, r // 2)).flip(-2).flatten(-2)
        return torch.cat([torch.addcmul(rot * step.cos, flipped, step.sin), keep], dim=-1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        b, s, t = step.batch, step.seq, step.key_len
        nh, nkv, d = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        g = nh // nkv
        qkv = self.qkv(x).view(b, s, -1)
        qg = qkv[..., : nh * 2 * d].reshape(b, s, nh, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(b * s, nh * d)
        k = qkv[..., nh * 2 * d : (nh * 2 + nkv) * d].reshape(b, s, nkv, d)
        v = qkv[..., (nh * 2 + nkv) * d :].reshape(b, s, nkv, d)
        q, k = self._rope(self.q_norm(q), step), self._rope(self.k_norm(k), step)
        keys, values = cache.update(self.index, step, k, v)  # [B, nkv, T, d]
        q = q.reshape(b, s, nkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, nkv, g * s, d)
        scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(d**-0.5).view(b, nkv, g, s, t)
        probs = scores.add_(step.bias).softmax(-1).view(b, nkv, g * s, t)
        out = torch.matmul(probs, values).view(b, nkv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b * s, nh * d)
        return self.o(out * torch.sigmoid(gate), residual)


class SparseDecoderLayer(nn.Module):
    """A token mixer (attention or Gated DeltaNet) and an MLP (sparse or dense), pre-norm residual."""

    def __init__(self, cfg: ModelConfig, spec: SparseSpec, i: int):
        super().__init__()
        self.kind = spec.layer_types[i]
        index = spec.layer_types[:i].count(self.kind)  # this layer's slot among the layers of its kind
        if self.kind == "linear_attention":
            assert spec.linear is not None
            self.linear_attn = GatedDeltaNet(cfg, spec.linear, index)
        elif spec.hybrid:
            self.self_attn = GatedAttention(cfg, spec.rotary_dim, index)
        else:
            self.self_attn = Attention(cfg, index)
        self.sparse = spec.moe is not None and i in spec.moe.sparse_layers
        self.mlp = SparseMoE(cfg, spec.moe, i) if self.sparse else MLP(cfg)  # type: ignore[arg-type]
        norm = OffsetRMSNorm if spec.hybrid else RMSNorm
        self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def mixer(self) -> nn.Module:
        return self.linear_attn if self.kind == "linear_attention" else self.self_attn

    def fuse(self) -> None:
        self.mixer.fuse()
        self.mlp.fuse()

    def forward(self, x: torch.Tensor, step: Step, cache: SparseCache) -> torch.Tensor:
        x = self.mixer(self.input_layernorm(x), x, step, cache)
        h = self.post_attention_layernorm(x)
        return self.mlp(h, x, step, cache) if self.sparse else self.mlp(h, x)


class SparseCache(KVCache):
    """Keys/values of the full-attention layers, the linear layers' states, the sparse layers' routing."""

    def __init__(self, *, linear: LinearStates | None, routes: RoutingTable | None, **kv):
        super().__init__(**kv)
        self.linear, self.routes = linear, routes

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(x.nbytes for x in (self.linear, self.routes) if x is not None)

    def usable_prefix(self, cached: list[int], prompt: list[int]) -> int:
        if self.linear is None:
            return super().usable_prefix(cached, prompt)
        # a recurrent state exists only after all of `cached`: usable when the prompt extends it
        n = len(cached)
        return n if 0 < n < len(prompt) and prompt[:n] == cached else 0

    @property
    def forkable(self) -> bool:  # a recurrent state holds a whole sequence, not a prefix of it
        return self.linear is None

    def swap(self, a: int, b: int, length: int) -> None:
        super().swap(a, b, length)
        if self.linear is not None:
            self.linear.swap(a, b)
        if self.routes is not None:
            self.routes.swap(a, b, length)


class SparseCausalLM(CausalLM):
    """`CausalLM` with SparseDecoderLayers; (1 + w) final norm and partial RoPE for the hybrid models."""

    def __init__(self, cfg: ModelConfig, spec: SparseSpec):
        super().__init__(cfg, lambda c, i: SparseDecoderLayer(c, spec, i))
        self.spec = spec
        if spec.hybrid:
            self.model.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def checkpoint_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Multi-token-prediction heads (`mtp.*`) serve speculative decoding only; transformers skips them too.
        state = {n: t for n, t in state.items() if not n.startswith("mtp.")}
        return merge_experts(state, self.spec.moe.num_experts) if self.spec.moe is not None else state

    def new_cache(self, *, slots: int, max_seq_len: int) -> SparseCache:
        c, spec = self.cfg, self.spec
        dtype = self.lm_head.weight.dtype
        linear = routes = None
        if spec.linear is not None:
            layers = spec.layer_types.count("linear_attention")
            linear = LinearStates(layers=layers, slots=slots, cfg=spec.linear, dtype=dtype)
        if spec.moe is not None:
            routes = RoutingTable(
                slots=slots, max_seq_len=max_seq_len, layers=c.num_layers, top_k=spec.moe.top_k
            )
        return SparseCache(
            linear=linear, routes=routes, layers=spec.layer_types.count("full_attention"), slots=slots,
            kv_heads=c.num_kv_heads, max_seq_len=max_seq_len, head_dim=c.head_dim, dtype=dtype,
        )  # fmt: skip

    def setup_rope(self, max_seq_len: int) -> None:
        """cos/sin tables over the rotary channels only (transformers: inv_freq over rotary_dim)."""
        r = self.spec.rotary_dim
        inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))
        freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rope_cos, self.rope_sin = emb.cos(), emb.sin()
        self.rope_sin[:, : r // 2] *= -1  # rotate_half as a flip with a signed sin (model.py)


def sparse_model(model_dir: str | Path, cfg: ModelConfig) -> Callable[[], SparseCausalLM]:
    """A builder of the architecture's module (config.json read and checked now, before any allocation)."""
    spec = SparseSpec.read(model_dir, cfg)
    return lambda: SparseCausalLM(cfg, spec)
