"""Helpers shared by the teacher tests."""

from __future__ import annotations

import torch


def fp32_tolerance(ref32: torch.Tensor, ref64: torch.Tensor) -> float:
    """How far an fp32 forward may be from the float64 one: 4x what transformers' own fp32 forward is off (the
    engine's fused, transposed kernels sum in another order: another draw of rounding errors of that size),
    plus 16 ulp of the largest log-prob for the final log-softmax."""
    eps = torch.finfo(torch.float32).eps
    return 4 * float((ref32 - ref64).abs().max()) + 16 * eps * max(1.0, float(ref64.abs().max()))
