"""Build the embedded engine's module for a Hugging Face model directory and load its safetensors (strict).

Dense decoders are model.py's `CausalLM`; Mixture-of-Experts and hybrid linear-attention Qwen models are
sparse.py's, which builds on model.py's layers. The choice lives here, above both, so that model.py does not
import what imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from agent_rl.engines.embedded import SPARSE_ARCHITECTURES
from agent_rl.engines.embedded.model import DTYPES, CausalLM, ModelConfig
from agent_rl.engines.embedded.sparse import sparse_model
from agent_rl.weights.tensors import read_safetensors_dir


def load_model(model_dir: str | Path, *, dtype: str = "float32", max_seq_len: int = 2048) -> CausalLM:
    """Build the module from config.json and load every *.safetensors file of the directory (strict)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    cfg = ModelConfig.from_dir(model_dir)
    make: Callable[[], CausalLM] = lambda: CausalLM(cfg)  # noqa: E731
    if cfg.architecture in SPARSE_ARCHITECTURES:
        make = sparse_model(model_dir, cfg)
    with torch.device("meta"):
        model = make()
    model = model.to_empty(device="cpu").to(DTYPES[dtype])
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    state = read_safetensors_dir(model_dir)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {n: t for n, t in state.items() if not n.endswith("rotary_emb.inv_freq")}
    state = model.checkpoint_state(state)
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
    model.fuse()
    model.setup_rope(max_seq_len)
    return model.eval()
