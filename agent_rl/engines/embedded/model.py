"""A plain-torch decoder for Hugging Face Qwen2 / Qwen3 / Llama / Mistral checkpoints, read from safetensors.

Mistral's sliding-window attention is a mask (a query sees the last `sliding_window` keys); the KV cache
still holds every position of a request (correct, not the memory saving of a rolling cache).

Parameter names are the Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...), so a
checkpoint or a learner's `state_dict()` copies in without a name map. One `forward` serves
prefill and decode: every row brings its own positions, and the rows are a contiguous range of
cache slots (the scheduler keeps running requests packed), so requests of different lengths share
one batch (continuous batching) and attention reads the cache in place.

Why hand-written and how it is fast on CPU (measured on SmolLM2-135M, benchmarks/engine_bench.py):
- the weights of each layer are fused (q|k|v, gate|up) and stored transposed, `[in, out]`
  contiguous: `x @ W` runs MKL's GEMM without the transposed-operand path of `F.linear`, which
  costs ~1.5-2x at 16-64 rows. Each Hugging Face parameter is a (transposed) view into the fused
  matrix, so an in-place weight push (`copy_weights_`) writes straight into what the matmul reads;
- residual adds ride in the GEMM (`addmm`), RoPE is one flip and two multiply-adds, the cache
  write is one `index_copy_` per layer with indices computed once per step, and logits are computed
  only at each row's last position.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from agent_rl.engines.embedded.cache import KVCache
from agent_rl.engines.embedded.fused import Fused, PackedHead  # noqa: F401
from agent_rl.engines.embedded.shapes import DTYPES, SUPPORTED_ARCHITECTURES, ModelConfig, Step  # noqa: F401


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel; same math as HF's in fp32
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # As HF: normalise in fp32, cast back, then scale (in the low precision), so bf16 rounds as HF does.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def fuse(self) -> None:
        self.qkv, self.o = Fused([self.q_proj, self.k_proj, self.v_proj]), Fused([self.o_proj])

    def forward(self, x: torch.Tensor, residual: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        """x: normalised input [N, H] (N = B*S); returns residual + attention output [N, H]."""
        b, s, t = step.batch, step.seq, step.key_len
        nh, nkv, d = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        g = nh // nkv
        qkv = self.qkv(x).view(b, s, nh + 2 * nkv, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(qkv[:, :, :nh]), self.k_norm(qkv[:, :, nh : nh + nkv])
            qk = torch.cat((q, k), dim=2)
        else:
            qk = qkv[:, :, : nh + nkv]
        # RoPE on q and k together: x*cos + rotate_half(x)*sin, rotate_half as a flip of the halves and a signed sin.
        rot = qk.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
        qk = torch.addcmul(qk * step.cos, rot, step.sin)
        keys, values = cache.update(self.layer, step, qk[:, :, nh:], qkv[:, :, nh + nkv :])  # [B, nkv, T, d]
        # Grouped-query attention: the g query heads of a kv head (times S positions) are the rows of one
        # [g*S, T] score matrix per (row, kv head); keys/values are read in place from the cache.
        q = qk[:, :, :nh].reshape(b, s, nkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, nkv, g * s, d)
        scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(d**-0.5).view(b, nkv, g, s, t)
        probs = scores.add_(step.bias).softmax(-1).view(b, nkv, g * s, t)
        out = torch.matmul(probs, values).view(b, nkv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b * s, nh * d)
        return self.o(out, residual)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def fuse(self) -> None:
        self.gate_up, self.down = Fused([self.gate_proj, self.up_proj]), Fused([self.down_proj])

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate).mul_(up), residual)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(self, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        x = self.self_attn(self.input_layernorm(x), x, step, cache)
        return self.mlp(self.post_attention_layernorm(x), x)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, make_layer: Callable[[ModelConfig, int], nn.Module] = DecoderLayer):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(make_layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """`model.*` + `lm_head` exactly as in a Hugging Face `*ForCausalLM` checkpoint."""

    def __init__(self, cfg: ModelConfig, make_layer: Callable[[ModelConfig, int], nn.Module] = DecoderLayer):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg, make_layer)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None
        self.head_fp32 = False  # model.lm_head_fp32: final norm and head in fp32 (logits)
        self._fp32: dict[str, tuple[int, torch.Tensor]] = {}  # name -> (weight version, fp32 copy)

    def fuse(self) -> None:
        """Store every matrix transposed and fused (see the module docstring); parameters become views."""
        for layer in self.model.layers:
            layer.fuse()
        self.head = PackedHead([self.lm_head])  # [H, V]; tied: the embedding is a view of it
        if self.cfg.tie_word_embeddings:
            self.model.embed_tokens.weight = self.lm_head.weight

    def checkpoint_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors under this module's parameter names (sparse.py merges per-expert tensors)."""
        return state

    def new_cache(self, *, slots: int, max_seq_len: int) -> KVCache:
        """The per-slot state this model keeps between steps (keys and values; sparse.py adds more)."""
        c = self.cfg
        return KVCache(
            layers=c.num_layers, slots=slots, kv_heads=c.num_kv_heads, max_seq_len=max_seq_len,
            head_dim=c.head_dim, dtype=self.lm_head.weight.dtype,
        )  # fmt: skip

    def setup_rope(self, max_seq_len: int) -> None:
        """Precompute cos/sin tables (fp32, like HF) for positions 0..max_seq_len-1."""
        d = self.cfg.head_dim
        inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rope_cos, self.rope_sin = emb.cos(), emb.sin()
        self.rope_sin[:, : d // 2] *= -1  # rotate_half(x) = cat(-x2, x1) = flip(x) * (-1 | +1)

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, start: int, key_len: int, cache: KVCache, last
    ) -> torch.Tensor:
        """Logits at `last[b]` of each row. tokens/positions: [B, S] (rows = cache slots start..start+B-1);
        key_len: max(positions) + 1; last: [B]. Returns [B, V] fp32."""
        x = self.hidden_states(tokens, positions, start, key_len, cache, last)
        return self.logits(x[torch.arange(x.shape[0]), last])  # only the rows' last real positions

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 logits of last-layer hidden states x [N, H] (before the final norm). `head_fp32` (a bf16 model):
        the final norm's output and the head's matmul in fp32, on fp32 copies of the norm's and head's weights
        (refreshed whenever a weight update writes them in place), as the learner computes them."""
        if not self.head_fp32 or self.head.weight.dtype == torch.float32:
            return self.head(self.model.norm(x)).float()
        norm = self.model.norm
        if isinstance(norm, RMSNorm):
            h = F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps) * self._as_fp32("norm", norm.weight)
        else:  # sparse.OffsetRMSNorm (hybrid models) normalises and scales in fp32 and keeps x's dtype
            h = norm(x.float())
        return h @ self._as_fp32("head", self.head.weight)

    def _as_fp32(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """An fp32 copy of `weight`, made again after any in-place write (torch bumps `_version` on each)."""
        kept = self._fp32.get(name)
        if kept is None or kept[0] != weight._version:
            kept = self._fp32[name] = (weight._version, weight.detach().float())
        return kept[1]

    @torch.inference_mode()
    def hidden_states(
        self, tokens: torch.Tensor, positions: torch.Tensor, start: int, key_len: int, cache: KVCache, last
    ) -> torch.Tensor:
        """The last layer's output at every position [B, S, H] (forward's arguments; linear-attention layers keep
        their recurrent state at `last`); scoring reads them all."""
        assert self.rope_cos is not None, "call setup_rope() first"
        dtype = self.head.weight.dtype
        b, s = tokens.shape
        nkv = self.cfg.num_kv_heads
        # A query at position p sees keys 0..p of its own slot (the last `sliding_window` of them under a window:
        # the cache keeps every position, the mask hides the older ones); padded queries see garbage nobody reads.
        keys = torch.arange(key_len)[None, None, :]
        hidden = keys > positions[:, :, None]
        if self.cfg.sliding_window is not None:
            hidden |= keys <= positions[:, :, None] - self.cfg.sliding_window
        slot_rows = (
            torch.arange(start, start + b)[:, None, None] * nkv + torch.arange(nkv)
        ) * cache.max_seq_len
        # slot_rows: [B, 1, nkv] first cache row of each (slot, kv head); + positions [B, S, 1]
        step = Step(
            batch=b,
            seq=s,
            key_len=key_len,
            start=start,
            cos=self.rope_cos[positions].unsqueeze(2).to(dtype),
            sin=self.rope_sin[positions].unsqueeze(2).to(dtype),
            bias=torch.zeros(b, 1, 1, s, key_len, dtype=dtype).masked_fill_(
                hidden[:, None, None], float("-inf")
            ),
            write=(slot_rows + positions[:, :, None]).reshape(-1),
            positions=positions,
            last=last,
        )
        x = self.model.embed_tokens.weight[tokens.reshape(-1)].to(dtype)  # [B*S, H]
        for layer in self.model.layers:
            x = layer(x, step, cache)
        return x.view(b, s, -1)
