"""Fused linears of the embedded engine: several `nn.Linear` sharing one input as one transposed matrix, and the
LM head on a prepacked oneDNN weight. Below model.py, moe.py and linear_attention.py, which all fuse weights."""

from __future__ import annotations

import torch
from torch import nn


class Fused:
    """Linears sharing one input as one `[in, sum(out)]` matrix; each HF parameter becomes a view of it.

    From `MIN_ROWS` rows on, an fp32 matrix of at least `MIN_NUMEL` entries runs oneDNN's matmul on a prepacked
    copy of the weight instead of MKL's GEMM (issue 62: CPU time per call, 1 thread, AVX-512 EPYC, 16 rows:
    SmolLM2-135M's gate|up 2.0-2.5x, down 1.5x, q|k|v 1.1-1.3x faster; the toy model's gate|up 1.5x; at 1 row
    and below 2**18 entries, as the toy model's q|k|v and o, plain `x @ W` is as fast or faster). The copy costs
    the weight's memory again; it follows in-place weight writes (`_packed`). Results differ from MKL's by the
    order of the fp32 sums only."""

    MIN_ROWS = 4
    MIN_NUMEL = 2**18

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
        self.packed: torch.Tensor | None = None
        self.packed_version = -1
        self.pack = (
            self.weight.dtype == torch.float32
            and self.weight.numel() >= self.MIN_NUMEL
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        )

    def _packed(self) -> torch.Tensor:
        """The prepacked copy, refreshed when the weight was written in place since (a weight push): torch bumps
        the version counter of a tensor and of all its views on every in-place write."""
        if self.packed_version != self.weight._version:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.t(), None)
            self.packed_version = self.weight._version
        return self.packed

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W (+ bias) (+ residual), for x: [N, in]."""
        if self.pack and x.shape[0] >= self.MIN_ROWS:
            out = torch.ops.mkldnn._linear_pointwise(x, self._packed(), self.bias, "none", [], "")
            return out if residual is None else out.add_(residual)
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
    MIN_NUMEL = 2**22

    @property
    def enabled(self) -> bool:
        return self.pack
