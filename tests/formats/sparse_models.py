"""Small random Mixture-of-Experts and hybrid linear-attention checkpoints: Qwen3-MoE, Qwen3-Next, Qwen3.5, Qwen3.5-MoE.

Each is written by transformers' own config and model classes (so the layout on disk is what
`save_pretrained` writes for a downloaded one: per-expert tensors), with a given model directory's
tokenizer or none (token ids only, a small vocabulary). Every weight is random: transformers initialises
norm scales, DeltaNet's dt_bias and biases to constants, which would let a swapped or dropped one pass
unseen, so those are drawn here too. Shapes are tiny but keep every structural choice of the real
models: GQA, head_dim != hidden / heads, a dense MLP between sparse ones (`mlp_only_layers`), top-2 of 8
experts with and without a shared expert, more value heads than key heads in the DeltaNet layers,
partial RoPE, and both kinds of token mixer in one stack.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ARCHS = ("qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
MOE_ARCHS = ("qwen3_moe", "qwen3_next", "qwen3_5_moe")
HYBRID_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def sparse_config(arch: str, vocab: int):
    """The transformers config of a tiny `arch` model."""
    from transformers import Qwen3MoeConfig, Qwen3NextConfig
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    base = dict(
        vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=1024, initializer_range=0.08, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    linear = dict(
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    )  # fmt: skip
    rope = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    if arch == "qwen3_moe":  # as Qwen3-30B-A3B: renormalised top-k, no shared expert; layer 1 dense
        return Qwen3MoeConfig(
            **base, **moe, num_hidden_layers=3, intermediate_size=96, norm_topk_prob=True, mlp_only_layers=[1],
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        )  # fmt: skip
    if arch == "qwen3_next":  # shared expert with its sigmoid gate; layer 2 dense
        return Qwen3NextConfig(
            **base, **moe, **linear, num_hidden_layers=4, intermediate_size=96, shared_expert_intermediate_size=48,
            norm_topk_prob=True, mlp_only_layers=[2], rope_parameters=rope,
        )  # fmt: skip
    if arch == "qwen3_5":
        return Qwen3_5TextConfig(
            **base, **linear, num_hidden_layers=4, intermediate_size=96, rope_parameters=rope
        )
    if arch == "qwen3_5_moe":
        return Qwen3_5MoeTextConfig(
            **base,
            **moe,
            **linear,
            num_hidden_layers=4,
            shared_expert_intermediate_size=48,
            rope_parameters=rope,
        )
    raise ValueError(arch)


def randomise_constants(model) -> None:
    """Draw every parameter init left constant: (1 + w) norm weights (zeros) and DeltaNet's output norm and
    plain norms (ones) from spreads around their init, dt_bias from N(1, 0.5), biases from N(0, 0.08)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() <= 1 or not bool((p == p.flatten()[0]).all()):
                continue
            if name.endswith("norm.weight"):
                p.add_(torch.empty_like(p).uniform_(-0.5, 0.5))
            elif name.endswith("dt_bias"):
                p.normal_(1.0, 0.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.08)
            else:
                raise AssertionError(f"{name}: constant after init, and no rule to draw it")


SMALL_VOCAB = 4096  # parity checkpoints without a tokenizer: token ids in, the output head stays cheap


def sparse_model(arch: str, out: Path, *, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """Write a tiny random `arch` checkpoint into `out`: with the tokenizer of `tokenizer_dir` (a model directory,
    e.g. the tiny BPE one `agent_rl.tools.tiny` writes: what `serve` and `train` load) and its vocabulary, else
    SMALL_VOCAB token ids and no tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = None
    if tokenizer_dir is not None:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        cfg = sparse_config(arch, len(tok))
        cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    else:
        cfg = sparse_config(arch, SMALL_VOCAB)
        cfg.eos_token_id, cfg.pad_token_id = SMALL_VOCAB - 1, SMALL_VOCAB - 2
    cfg.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomise_constants(model)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    if tok is not None:
        tok.save_pretrained(out)
    return out
