"""LoRA adapters in the embedded engine: merged into the weights in place, the base weights kept.

Merge rather than add B·A·x at every forward: a run pushes one adapter per step and then decodes
thousands of tokens with it. Merged, a decode step costs what it costs without LoRA and the fused
qkv / gate_up matmuls stay single matmuls; a low-rank add would cost two more small matmuls per
targeted linear per step (14 per layer with every linear targeted). The merge itself is one
[out, r] x [r, in] product per targeted matrix, once per push.

Exactness: the engine keeps a copy of every targeted matrix as it was before the first adapter, and
each push writes W = W_base + (α/r)·B·A (computed in fp32, then cast to the engine's dtype) from that
copy, so the weights after push v depend only on the base and adapter v, never on the pushes before.
A full-weight update makes the new weights the base (restoring first any targeted matrix it leaves out).
Over HTTP: engines/embedded/lora_routes.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from agent_rl.weights.adapters import Adapter
from agent_rl.weights.tensors import WeightsRejected

if TYPE_CHECKING:
    from torch import nn


class MergedAdapter:
    """The adapter merged into a model's weights, and the base copies of the matrices it touches."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}
        self.name: str | None = None  # what the adapter was loaded as (HTTP: lora_name)

    @torch.no_grad()
    def apply(self, model: nn.Module, adapter: Adapter, name: str) -> None:
        """Merge `adapter` (replacing the one merged before); checks every name and shape before writing."""
        params = dict(model.named_parameters())
        pairs = adapter.pairs()
        for w, (a, b) in pairs.items():
            if w not in params:
                raise WeightsRejected(f"adapter {name!r}: {w} is not a weight of this model")
            out, inp = params[w].shape
            if a.shape != (adapter.rank, inp) or b.shape != (out, adapter.rank):
                raise WeightsRejected(
                    f"adapter {name!r}: {w} A {tuple(a.shape)} / B {tuple(b.shape)} do not fit weight {(out, inp)} at rank {adapter.rank}"
                )
            if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
                raise WeightsRejected(f"adapter {name!r}: {w} contains NaN or inf")
        for w in [w for w in self.base if w not in pairs]:  # targeted by the last adapter, not by this one
            params[w].copy_(self.base.pop(w))
        for w, (a, b) in pairs.items():
            base = self.base.setdefault(w, params[w].detach().clone())
            params[w].copy_(base.float() + adapter.scale * (b.float() @ a.float()))
        self.name = name

    @torch.no_grad()
    def unload(self, model: nn.Module) -> None:
        """Back to the base weights."""
        params = dict(model.named_parameters())
        for w, t in self.base.items():
            params[w].copy_(t)
        self.base.clear()
        self.name = None

    @torch.no_grad()
    def rebase(self, model: nn.Module, updated: Iterable[str]) -> None:
        """Full weights were copied in (`updated`): they are the base now; matrices left out go back to theirs."""
        params, updated = dict(model.named_parameters()), set(updated)
        for w, t in self.base.items():
            if w not in updated:
                params[w].copy_(t)
        self.base.clear()
        self.name = None
