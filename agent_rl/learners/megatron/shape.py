"""The architecture of a Hugging Face causal LM, read once from its config (no megatron import).

Only the decoder families whose layers Megatron's GPTModel reproduces exactly are accepted:
Qwen2/Qwen2.5, Qwen3 (q/k RMSNorm per head: megatron's qk_layernorm) and Llama (RoPE without
scaling, GQA, SwiGLU, RMSNorm, tied or untied embeddings), and Qwen3-MoE (Qwen3's attention with
megatron's MoE layer on the sparse layers: `MoEShape`, `moe.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen3_moe")


@dataclass(frozen=True)
class MoEShape:
    """The sparse MLPs of a Qwen3-MoE model: top-k of `experts` SwiGLU experts, softmax router, no shared expert."""

    experts: int
    top_k: int
    ffn_hidden: int
    """moe_intermediate_size: each expert's SwiGLU width."""
    norm_topk_prob: bool
    """True: the k gates renormalised to sum 1 (megatron: softmax over the top-k logits)."""
    sparse: tuple[bool, ...]
    """Per layer: an MoE layer (False: a dense MLP of intermediate_size, HF mlp_only_layers / decoder_sparse_step)."""


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
    moe: MoEShape | None = None
    """Qwen3-MoE: the sparse layers (None: every layer a dense MLP)."""

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
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and getattr(cfg, "use_sliding_window", False):
        raise ValueError(f"Megatron learner: {model_type} use_sliding_window=True is not supported")
    if model_type in ("llama", "qwen3", "qwen3_moe") and (
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
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        moe=_moe_shape(cfg) if model_type == "qwen3_moe" else None,
    )


def _moe_shape(cfg: Any) -> MoEShape:
    """Qwen3-MoE's sparse layers as transformers builds them: layer i is sparse unless i is in mlp_only_layers
    or (i + 1) is not a multiple of decoder_sparse_step."""
    dense = set(getattr(cfg, "mlp_only_layers", None) or ())
    step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    sparse = tuple(
        i not in dense and cfg.num_experts > 0 and (i + 1) % step == 0 for i in range(cfg.num_hidden_layers)
    )
    return MoEShape(
        experts=cfg.num_experts,
        top_k=cfg.num_experts_per_tok,
        ffn_hidden=cfg.moe_intermediate_size,
        norm_topk_prob=bool(cfg.norm_topk_prob),
        sparse=sparse,
    )
