"""LoRA in the torch learner through PEFT: wrap the model, read the adapter out, merge it for exports.

PEFT freezes every base weight, so the optimizer, the vcpo step (its parameters are those with
requires_grad: per-trajectory gradient norms and exact OPOB run over the adapter alone) and the
checkpoint hold only adapter tensors. The merged weights (W + α/r·B·A) are computed on demand for the
hf/ export; the model itself is never merged and unmerged in place, which would drift the base weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agent_rl.errors import UserError
from agent_rl.weights.adapters import Adapter

if TYPE_CHECKING:
    from torch import nn

    from agent_rl.config import LoraConfig

INSTALL = "pip install 'agent-rl[lora]' (or: pip install peft)"


def _peft():
    try:
        import peft
    except ImportError as e:
        raise UserError(f"learner.lora trains adapters with PEFT, which is not installed: {INSTALL}") from e
    return peft


def wrap(model: nn.Module, cfg: LoraConfig, *, gradient_checkpointing: bool) -> nn.Module:
    """The PEFT model: base frozen, adapters on `cfg.target_modules` (B = 0: the first policy is the base)."""
    peft = _peft()
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in cfg.target_modules if t not in present]
    if missing:
        raise UserError(f"learner.lora.target_modules: {missing} are not modules of this model; drop them")
    config = peft.LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules),
        bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    if (
        gradient_checkpointing
    ):  # checkpointed blocks need an input that requires grad (the embeddings are frozen)
        model.enable_input_require_grads()
    return peft.get_peft_model(model, config)


def adapter_of(model: nn.Module, cfg: LoraConfig) -> Adapter:
    """The adapter's current tensors (fp32 copies) under PEFT's names."""
    state = _peft().get_peft_model_state_dict(model)
    return Adapter(
        {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in state.items()},
        cfg.rank,
        cfg.alpha,
        tuple(cfg.target_modules),
    )


def load_adapter_(model: nn.Module, adapter: Adapter) -> None:
    """Copy `adapter`'s tensors into the PEFT model (checkpoint resume); every tensor must fit."""
    result = _peft().set_peft_model_state_dict(model, adapter.tensors)
    bad = [k for k in result.unexpected_keys if "lora_" in k]
    if bad:
        raise ValueError(f"adapter does not match the model: unexpected {bad[:3]}")


@torch.no_grad()
def merged_state_dict(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The base model's state dict under HF names with every adapter merged in: W + α/r·B·A (fp32, then `dtype`)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {
        f"{name}.weight": m.get_delta_weight("default")
        for name, m in base.named_modules()
        if isinstance(m, LoraLayer) and "default" in m.lora_A
    }
    out = {}
    for name, t in base.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        merged = t.float() + deltas[name].float() if name in deltas else t
        out[name] = merged.detach().to("cpu", dtype=dtype, copy=True)
    return out
