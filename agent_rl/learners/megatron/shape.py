"""The architecture of a Hugging Face causal LM, read once from its config (no megatron import).

Only the decoder families whose layers Megatron's GPTModel reproduces exactly are accepted:
Qwen2/Qwen2.5, Qwen3 (q/k RMSNorm per head: megatron's qk_layernorm) and Llama (RoPE without
scaling, GQA, SwiGLU, RMSNorm, tied or untied embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class ModelShape:
    """Everything the Megatron model and the weight converter need to know about the HF model."""

    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    qkv_bias: bool
    tie_embeddings: bool
    pad_token_id: int | None = None
    qk_norm: bool = False
    """Qwen3: RMSNorm over each head's q and k before RoPE (HF q_norm/k_norm, megatron q/k_layernorm)."""
    """HF builds the embedding with padding_idx=pad_token_id: that row never receives a gradient."""

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.kv_heads

    def check_tp(self, tp: int) -> None:
        """Tensor parallelism splits heads, KV groups, the FFN and the vocabulary: each must divide by tp."""
        for what, n in (
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("intermediate_size", self.ffn_hidden),
            ("vocab_size", self.vocab_size),
        ):
            if n % tp:
                raise ValueError(f"learner.tp={tp} does not divide the model's {what}={n}")


def shape_from_hf_config(cfg: Any) -> ModelShape:
    """Read a transformers config (Qwen2Config, LlamaConfig); raise naming the field Megatron cannot reproduce."""
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"Megatron learner: model_type {model_type!r} is not supported; use one of {SUPPORTED_MODEL_TYPES}"
        )
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"Megatron learner: hidden_act {cfg.hidden_act!r}; only silu (SwiGLU) is supported")
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"Megatron learner: rope_parameters.rope_type {rope_type!r}; only unscaled RoPE is supported"
        )
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        raise ValueError("Megatron learner: the config has no rope_theta")
    if model_type in ("qwen2", "qwen3") and getattr(cfg, "use_sliding_window", False):
        raise ValueError(f"Megatron learner: {model_type} use_sliding_window=True is not supported")
    if model_type in ("llama", "qwen3") and (
        getattr(cfg, "mlp_bias", False) or getattr(cfg, "attention_bias", False)
    ):
        raise ValueError(
            f"Megatron learner: {model_type} mlp_bias/attention_bias=True is not supported (o_proj/MLP biases)"
        )
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelShape(
        vocab_size=cfg.vocab_size,
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden=cfg.intermediate_size,
        norm_eps=cfg.rms_norm_eps,
        rope_theta=float(theta),
        max_positions=cfg.max_position_embeddings,
        qkv_bias=model_type == "qwen2",
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        pad_token_id=getattr(cfg, "pad_token_id", None),
        qk_norm=model_type == "qwen3",
    )
