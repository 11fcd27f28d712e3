"""Fused linears of the embedded engine: several `nn.Linear` sharing one input as one transposed matrix, and the
LM head on a prepacked oneDNN weight. Below model.py, moe.py and linear_attention.py, which all fuse weights."""

from __future__ import annotations

import torch
from torch import nn


class Fused:
    """Linears sharing one input as one `[in, sum(out)]` matrix; each HF parameter becomes a view of it."""

    def __init__(self, modules: list[nn.Linear]):
        self.weight = torch.cat([m.weight.detach() for m in modules]).t().contiguous()  # [in, out]
        biases = [m.bias for m in modules]
        self.bias = torch.cat([b.detach() for b in biases]) if biases[0] is not None else None
        at = 0
        for m in modules:
            n = m.weight.shape[0]
            m.weight = nn.Parameter(self.weight[:, at : at + n].t(), requires_grad=False)
            if self.bias is not None:
                m.bias = nn.Parameter(self.bias[at : at + n], requires_grad=False)
            at += n

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W (+ bias) (+ residual), for x: [N, in]."""
        if residual is not None:
            assert self.bias is None, "a fused residual and a bias: not needed by any supported architecture"
            return torch.addmm(residual, x, self.weight)
        if self.bias is not None:
            return torch.addmm(self.bias, x, self.weight)
        return x @ self.weight


class PackedHead(Fused):
    """The LM head: above `MIN_ROWS` rows it runs oneDNN's matmul on a prepacked copy of the weight.

    MKL's GEMM is slow for a [rows, H] x [H, 49k+] product: oneDNN on a prepacked weight took 15 ms
    instead of 24 ms at 16 rows and 31 instead of 41 ms at 64 rows (SmolLM2, 1 thread, runs/); at
    1-4 rows plain `x @ W` is faster. The copy is refreshed whenever the weight was written in place
    (torch bumps the version counter of a tensor and all its views on every in-place write).
    """

    MIN_ROWS = 8

    def __init__(self, modules: list[nn.Linear]):
        super().__init__(modules)
        self.packed: torch.Tensor | None = None
        self.packed_version = -1
        self.enabled = (
            self.weight.dtype == torch.float32
            and self.weight.numel() >= 2**22
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        )

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.enabled or x.shape[0] < self.MIN_ROWS:
            return super().__call__(x, residual)
        if self.packed_version != self.weight._version:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.t(), None)
            self.packed_version = self.weight._version
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
