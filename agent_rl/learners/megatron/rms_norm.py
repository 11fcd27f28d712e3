"""RMSNorm whose backward keeps the input and one fp32 scale per token, nothing of the hidden size in fp32.

    y = x / sqrt(mean(x²) + eps) · w          (computed in fp32, rounded once to x's dtype, or to `out_dtype`)

torch's `rms_norm` autograd on CPU (a composite of elementwise ops in torch 2.13) keeps three
fp32 tensors of x's size for backward, 12 bytes per element, whatever x's dtype: 21 KB per token
per norm at hidden 896, two norms per layer (measured with saved_tensors_hooks). This function
keeps x itself (2 bytes per element in bf16) and rstd ([..., 1] fp32), and recomputes x̂ = x·rstd in
backward:

    dx = rstd · (dŷ − x̂ · mean(dŷ · x̂)),   dŷ = dy · w;      dw = Σ_tokens dy · x̂

`out_dtype=torch.float32` keeps a bf16 input's y in fp32 (the final norm under model.lm_head_fp32: the head
gets the norm's output unrounded); dy then arrives in fp32 and dx is returned in x's dtype.

Hand-written because megatron's own norms for sequence parallelism come from Transformer Engine
or Apex, which this path runs without (see cpu_compat.SequenceParallelRMSNorm).
"""

from __future__ import annotations

import torch
from torch import Tensor


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype | None) -> Tensor:
        xf = x.to(_compute(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.to(xf.dtype)).to(out_dtype or x.dtype)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.to(rstd.dtype) * rstd
        dyf = dy.to(rstd.dtype)
        dy_w = dyf * weight.to(rstd.dtype)
        dx = rstd * (dy_w - x_hat * (dy_w * x_hat).mean(-1, keepdim=True))
        dw = (dyf * x_hat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None, None


def _compute(x: Tensor) -> torch.dtype:
    """fp32 for fp32 and lower precisions, fp64 for fp64."""
    return torch.promote_types(x.dtype, torch.float32)


def rms_norm(x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype | None = None) -> Tensor:
    """RMSNorm over the last dimension of x with a [hidden] weight, returned in `out_dtype` (default: x's dtype);
    see the module docstring."""
    return _RMSNorm.apply(x, weight, eps, out_dtype)
