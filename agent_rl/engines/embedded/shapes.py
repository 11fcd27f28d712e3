"""The embedded engine's shared types, one floor below the model, the cache and the MoE/linear-attention layers
(which all use them): what a checkpoint's config says (`ModelConfig`) and what every layer of one forward shares
(`Step`). Here so that model.py -> cache.py -> moe.py needs no import back up to model.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from agent_rl.engines.embedded import SPARSE_ARCHITECTURES  # MoE / hybrid linear attention: sparse.py

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
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
    attention_bias: bool  # Qwen2 has q/k/v biases; Llama, Mistral and Qwen3 (by default) do not
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on every query and key head, before RoPE
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    architecture: str = ""  # config.json's architectures[0]
    # Mistral: a query at position p attends to keys p - sliding_window + 1 .. p (as transformers masks it)
    sliding_window: int | None = None

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
        if arch not in SUPPORTED_ARCHITECTURES + SPARSE_ARCHITECTURES:
            raise ValueError(
                f"{path}: architecture {arch!r} is not supported; use one of "
                f"{SUPPORTED_ARCHITECTURES + SPARSE_ARCHITECTURES}"
            )
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{path}: rope type {rope_type!r} is not supported (only 'default' RoPE)")
        if c.get("use_sliding_window"):  # Qwen2/Qwen3: a window on some layers only (max_window_layers)
            raise ValueError(f"{path}: use_sliding_window (Qwen's per-layer window) is not supported")
        window = c.get("sliding_window") if arch == "MistralForCausalLM" else None  # Mistral: every layer
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"{path}: sliding_window must be a positive integer or null, got {window!r}")
        if c.get("mlp_bias") or c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{path}: only SwiGLU MLPs without bias are supported (mlp_bias, hidden_act)")
        heads = c["num_attention_heads"]
        eos: list[int] = []
        for src in (c, _read_json(Path(model_dir) / "generation_config.json")):
            e = src.get("eos_token_id")
            eos += e if isinstance(e, list) else [] if e is None else [e]
        return cls(
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=c.get("intermediate_size", 0),  # Qwen3.5-MoE: every MLP is sparse
            num_layers=c["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
            attention_bias=c.get("attention_bias", arch == "Qwen2ForCausalLM"),
            qk_norm=arch == "Qwen3ForCausalLM" or arch in SPARSE_ARCHITECTURES,
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            max_position_embeddings=c.get("max_position_embeddings", 2048),
            eos_token_ids=tuple(dict.fromkeys(eos)),
            architecture=arch,
            sliding_window=window,
        )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


@dataclass
class Step:
    """What every layer of one forward shares: shapes, rotary tables, attention mask, cache indices."""

    batch: int
    seq: int
    key_len: int
    start: int  # the rows are cache slots start..start+batch-1
    cos: torch.Tensor  # [B, S, 1, d]
    sin: torch.Tensor  # [B, S, 1, d], sign of rotate_half folded in
    bias: torch.Tensor  # additive mask [B, 1, 1, S, T]
    write: torch.Tensor  # flat cache row of each (row, position, kv head), [B*S*nkv]
    positions: torch.Tensor | None = None  # [B, S] (linear-attention and MoE layers: sparse.py)
    last: torch.Tensor | None = None  # [B] index of each row's last real position
