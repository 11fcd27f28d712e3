"""A plain-torch decoder for Hugging Face Qwen2 / Llama checkpoints, read straight from safetensors.

Parameter names are the Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...), so a
checkpoint or a learner's `state_dict()` copies in without a name map. One `forward` serves
prefill and decode: every row brings its own positions and cache slot, so requests of different
lengths share one batch (continuous batching).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from agent_rl.engines.embedded.cache import KVCache

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool  # Qwen2 has q/k/v biases, Llama does not
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """Read config.json (+ generation_config.json for EOS ids); refuse what this engine can't run."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no config.json; MODEL_DIR must be a Hugging Face model directory"
            )
        c = json.loads(path.read_text())
        arch = (c.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{path}: architecture {arch!r} is not supported; use one of {SUPPORTED_ARCHITECTURES}"
            )
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{path}: rope type {rope_type!r} is not supported (only 'default' RoPE)")
        if c.get("use_sliding_window"):
            raise ValueError(f"{path}: sliding-window attention is not supported")
        heads = c["num_attention_heads"]
        eos: list[int] = []
        for src in (c, _read_json(Path(model_dir) / "generation_config.json")):
            e = src.get("eos_token_id")
            eos += e if isinstance(e, list) else [] if e is None else [e]
        return cls(
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            num_layers=c["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
            attention_bias=c.get("attention_bias", arch == "Qwen2ForCausalLM"),
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            max_position_embeddings=c.get("max_position_embeddings", 2048),
            eos_token_ids=tuple(dict.fromkeys(eos)),
        )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As HF: normalise in fp32, cast back, then scale, so fp32 logits agree to ~1e-6.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def fuse_(modules: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the linears' weights (and biases) into one matrix and make each HF-named parameter a view of it.

    One matmul instead of several per step, while `named_parameters()` still yields the Hugging Face
    names and shapes: copying new weights into a parameter in place writes into the fused matrix.
    """
    weight = torch.cat([m.weight.detach() for m in modules])
    bias = torch.cat([m.bias.detach() for m in modules]) if modules[0].bias is not None else None
    at = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(weight[at : at + n], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[at : at + n], requires_grad=False)
        at += n
    return weight, bias


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def fuse(self) -> None:
        self.qkv = fuse_([self.q_proj, self.k_proj, self.v_proj])

    def forward(self, x, cos, sin, positions, slots, cache: KVCache, key_len: int, bias) -> torch.Tensor:
        b, s, _ = x.shape  # x: [B, S, H]; positions: [B, S]; slots: ([B], dense); bias: [B * nkv, g * S, T]
        nh, nkv, d = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        g = nh // nkv
        qkv = F.linear(x, *self.qkv).view(b, s, nh + 2 * nkv, d)
        qk = qkv[:, :, : nh + nkv]  # rotate q and k together: [B, S, nh + nkv, d], cos/sin: [B, S, 1, d]
        qk = qk * cos + torch.cat((-qk[..., d // 2 :], qk[..., : d // 2]), dim=-1) * sin
        keys, values = cache.update(
            self.layer, *slots, positions, qk[:, :, nh:], qkv[:, :, nh + nkv :], key_len
        )
        # Grouped-query attention as two batched matmuls: the g query heads of a kv head (times S positions)
        # form the rows of one [g*S, T] score matrix. On CPU this beats SDPA's GQA path for decode shapes.
        q = qk[:, :, :nh].reshape(b, s, nkv, g, d).permute(0, 2, 3, 1, 4).reshape(b * nkv, g * s, d)
        scores = torch.baddbmm(bias, q, keys.reshape(b * nkv, key_len, d).transpose(1, 2), alpha=d**-0.5)
        out = torch.bmm(scores.softmax(-1), values.reshape(b * nkv, key_len, d))  # [B * nkv, g * S, d]
        return self.o_proj(out.view(b, nkv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, nh * d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None

    def fuse(self) -> None:
        self.gate_up, _ = fuse_([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, positions, slots, cache, key_len, bias):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, slots, cache, key_len, bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """`model.*` + `lm_head` exactly as in a Hugging Face `*ForCausalLM` checkpoint."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    def setup_rope(self, max_seq_len: int) -> None:
        """Precompute cos/sin tables (fp32, like HF) for positions 0..max_seq_len-1."""
        d = self.cfg.head_dim
        inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rope_cos, self.rope_sin = emb.cos(), emb.sin()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: KVCache,
        last: torch.Tensor,
        *,
        dense: bool = False,
    ) -> torch.Tensor:
        """Logits at `last[b]` of each row. tokens/positions: [B, S]; slots, last: [B]. Returns [B, V] fp32.

        dense: the rows are exactly cache slots 0..B-1 in order (the cache then returns views, not copies).
        """
        assert self.rope_cos is not None, "call setup_rope() first"
        dtype = self.model.embed_tokens.weight.dtype
        cos = self.rope_cos[positions].unsqueeze(2).to(dtype)  # [B, S, 1, d]
        sin = self.rope_sin[positions].unsqueeze(2).to(dtype)
        key_len = int(positions.max()) + 1
        # A query at position p sees keys 0..p of its own slot; padded queries see garbage nobody reads.
        b, s = tokens.shape
        nkv, g = self.cfg.num_kv_heads, self.cfg.num_heads // self.cfg.num_kv_heads
        visible = torch.arange(key_len)[None, None, None, None, :] <= positions[:, None, None, :, None]
        bias = torch.zeros(b, nkv, g, s, key_len, dtype=dtype).masked_fill_(~visible, float("-inf"))
        bias = bias.view(b * nkv, g * s, key_len)  # additive mask, one [g*S, T] block per (row, kv head)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin, positions, (slots, dense), cache, key_len, bias)
        x = x[torch.arange(x.shape[0]), last]  # only the rows' last real positions need logits
        return self.lm_head(self.model.norm(x)).float()


def load_model(model_dir: str | Path, *, dtype: str = "float32", max_seq_len: int = 2048) -> CausalLM:
    """Build the module from config.json and load every *.safetensors file of the directory (strict)."""
    from agent_rl.weights.tensors import read_safetensors_dir

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to_empty(device="cpu").to(DTYPES[dtype])
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    state = read_safetensors_dir(model_dir)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {n for n, _ in model.named_parameters()}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(
            f"{model_dir}: checkpoint does not match {type(model).__name__}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)
    for layer in model.model.layers:
        layer.self_attn.fuse()
        layer.mlp.fuse()
    model.setup_rope(max_seq_len)
    return model.eval()
