"""Per-token log-probs of a causal LM, and the forward-only proxy for ‖∇log π(τ)‖², without ever holding the
[tokens, vocab] log-softmax in float32.

Two ways in:

- `linear_logprobs(hidden, weight, targets)`: from the decoder's last hidden states and the output head's
  weight, in chunks of tokens: each chunk's logits are formed, log-softmaxed in fp32 and gathered, then
  dropped; the backward pass forms them again (the `_LinearLogSoftmax` autograd function). Peak memory is
  one chunk of logits, not [tokens, vocab]. This is what the torch learner uses.
- `logprobs_of(model, input_ids, attention_mask)` / `logit_grad_proxy_of`: any module called as
  ``model(input_ids, attention_mask=...)`` whose output has ``.logits`` [B, T, V] (Hugging Face causal LMs),
  the logits upcast to fp32 chunk by chunk (each chunk recomputed in backward). The reference definition,
  and the default of `vcpo.Step`; trainers with another model interface pass their own function of the same
  signature.

Why a hand-written chunked function and not Liger's fused linear cross-entropy (the well-kept kernel for
this): Liger is Triton-only (CUDA/ROCm/NPU), so the CPU learner could not use it; its per-token path
(``reduction="none"``) scaled every token's gradient by the first token's upstream gradient until
linkedin/Liger-Kernel#1298 (merged 2026-07), which an RL loss with per-token weights would train on
silently; and it returns the cross-entropy only, while the proxy needs Σ_v p_v² from the same softmax.
The chunked function does the same memory bound in plain torch on every device; the head's matmuls,
not the softmax, dominate its time.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

CHUNK_TOKENS = 1024
"""Default tokens per chunk: one chunk's logits are CHUNK_TOKENS x vocab in fp32 (0.6 GB at Qwen's 151936)."""


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """Log-softmax in fp32 (bf16 logits lose the tail), fp64 for a float64 model (exact comparisons)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def proxy_sq_norm(logprobs: Tensor, sum_p2: Tensor) -> Tensor:
    """‖∂ log p(y_t) / ∂ logits_t‖² = 1 − 2 p_y + Σ_v p_v² per token (∂ log softmax(z)_y / ∂z = e_y − p)."""
    return (1.0 - 2.0 * logprobs.exp() + sum_p2).clamp(min=0.0)


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, mm_dtype: torch.dtype) -> Tensor:
    """One chunk's logits [n, V] in `mm_dtype` (autocast's dtype when on), as `nn.Linear` would form them."""
    z = h.to(mm_dtype) @ weight.t()
    return z if bias is None else z.add_(bias)


class _LinearLogSoftmax(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (log p(targets) [N], Σ_v p_v² [N] or
    empty); see the module docstring. Σ p² is not differentiable (the proxy is read under no_grad).

    The passes over a chunk's [n, V] logits are what this costs beyond the head's matmuls, so each is counted:
    forward, the fp32 log-softmax (its gather gives the log-probs; proxy: exponentiated in place, one norm);
    backward, the softmax straight from the logits in the matmul's dtype (fp32 inside the kernel), scaled in
    place by each token's upstream gradient, and the targets' entries written from the saved log-probs:
    ∂ log p_y / ∂z = e_y − p, so the target's entry is g (1 − p_y) = −g expm1(log p_y), exact in fp32
    where p_y is near 1. In bf16 the gradient of the logits is rounded twice (the softmax, the scaling)
    where it used to be rounded once from fp32: 2^-8 relative instead of 2^-9, the order of the bf16 matmuls
    it feeds. On an H200 this took the torch learner from 0.93-0.97x to 0.99x the tokens/s of transformers +
    Liger with recompute (docs/benchmarks/gpu-learners.md)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, want_p2):  # type: ignore[override]
        device = hidden.device.type
        autocast = torch.is_autocast_enabled(device) and hidden.dtype in (torch.float32, torch.bfloat16)
        mm_dtype = torch.get_autocast_dtype(device) if autocast else hidden.dtype
        out_dtype = softmax_dtype(mm_dtype)
        n = hidden.shape[0]
        lp = hidden.new_empty(n, dtype=out_dtype)
        p2 = hidden.new_empty(n if want_p2 else 0, dtype=out_dtype)
        with torch.autocast(device, enabled=False):
            w = weight.to(mm_dtype)
            b = bias.to(mm_dtype) if bias is not None else None
            for s in range(0, n, chunk):
                logp = _chunk_logits(hidden[s : s + chunk], w, b, mm_dtype).log_softmax(-1, dtype=out_dtype)
                lp[s : s + chunk] = logp.gather(-1, targets[s : s + chunk, None]).squeeze(-1)
                if want_p2:
                    p2[s : s + chunk] = torch.linalg.vector_norm(logp.exp_(), dim=-1).square_()
        ctx.save_for_backward(hidden, weight, bias, targets, lp)
        ctx.chunk, ctx.mm_dtype, ctx.out_dtype = chunk, mm_dtype, out_dtype
        ctx.mark_non_differentiable(p2)
        return lp, p2

    @staticmethod
    def backward(ctx, g_lp, _g_p2):  # type: ignore[override]
        hidden, weight, bias, targets, lp = ctx.saved_tensors
        chunk, mm_dtype, out_dtype = ctx.chunk, ctx.mm_dtype, ctx.out_dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        d_h = torch.empty_like(hidden) if need_h else None  # every row is written below
        d_w = torch.zeros_like(weight, dtype=softmax_dtype(weight.dtype)) if need_w else None
        d_b = torch.zeros_like(bias, dtype=softmax_dtype(bias.dtype)) if need_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(mm_dtype)
            b = bias.to(mm_dtype) if bias is not None else None
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s : s + chunk].to(mm_dtype)
                g, y = g_lp[s : s + chunk].to(out_dtype), targets[s : s + chunk]
                # d log p_y / dz = e_y - p, times each token's upstream gradient g
                dz = _chunk_logits(h, w, b, mm_dtype).softmax(-1).mul_(-g[:, None])
                dz.scatter_(-1, y[:, None], (g * -torch.expm1(lp[s : s + chunk]))[:, None].to(mm_dtype))
                if d_h is not None:
                    d_h[s : s + chunk] = dz @ w
                if d_w is not None:
                    d_w.add_(dz.t() @ h)
                if d_b is not None:
                    d_b.add_(dz.sum(0))
        d_w = d_w.to(weight.dtype) if d_w is not None else None
        d_b = d_b.to(bias.dtype) if d_b is not None else None
        return d_h, d_w, d_b, None, None, None


def linear_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    with_sum_p2: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """log softmax(hidden @ weight.T + bias)[targets] per row [N] (fp32; fp64 for fp64 inputs), never more than
    `chunk_tokens` rows of logits at a time, forward or backward. Under autocast the matmuls run in autocast's
    dtype, as `nn.Linear` would. `with_sum_p2`: also Σ_v p_v² per row (no gradient), for `proxy_sq_norm`."""
    if chunk_tokens < 1:
        raise ValueError(f"linear_logprobs: chunk_tokens must be >= 1, got {chunk_tokens}")
    lp, p2 = _LinearLogSoftmax.apply(hidden, weight, bias, targets, chunk_tokens, with_sum_p2)
    return (lp, p2) if with_sum_p2 else lp


# -- the reference path: any model with .logits -------------------------------------------------------------


def _gather_logsoftmax(logits: Tensor, targets: Tensor) -> Tensor:
    return logits.to(softmax_dtype(logits.dtype)).log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


def logits_logprobs(logits: Tensor, targets: Tensor, *, chunk_tokens: int = CHUNK_TOKENS) -> Tensor:
    """log softmax(logits)[targets] over the last dim, in fp32 chunks of rows (fp64 for fp64 logits): each
    chunk's fp32 copy lives only while it is computed, in the forward pass and again in the backward."""
    flat, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    parts = [
        checkpoint(
            _gather_logsoftmax, flat[s : s + chunk_tokens], t[s : s + chunk_tokens], use_reentrant=False
        )
        if torch.is_grad_enabled() and flat.requires_grad
        else _gather_logsoftmax(flat[s : s + chunk_tokens], t[s : s + chunk_tokens])
        for s in range(0, flat.shape[0], chunk_tokens)
    ]
    return torch.cat(parts).reshape(targets.shape)


def logits_sum_p2(logits: Tensor, *, chunk_tokens: int = CHUNK_TOKENS) -> Tensor:
    """Σ_v p_v² over the last dim (no gradient), from fp32 chunks of rows as `logits_logprobs`."""
    flat = logits.detach().reshape(-1, logits.shape[-1])
    parts = [
        flat[s : s + chunk_tokens].to(softmax_dtype(flat.dtype)).log_softmax(-1).mul_(2.0).exp_().sum(-1)
        for s in range(0, flat.shape[0], chunk_tokens)
    ]
    return torch.cat(parts).reshape(logits.shape[:-1])


def _shifted_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    # Right padding needs no mask in a causal LM: padding only follows the real tokens, which
    # never attend forward, so their logits are the same; without a mask the attention kernel
    # takes its fast causal path (about 2x faster on CPU here). Other padding keeps the mask.
    am = attention_mask > 0
    right_padded = not bool((am[:, 1:] & ~am[:, :-1]).any())
    logits = (
        model(input_ids).logits if right_padded else model(input_ids, attention_mask=attention_mask).logits
    )
    return logits[:, :-1]  # position t-1 predicts token t


def _scatter_back(x: Tensor, width: int) -> Tensor:
    out = x.new_zeros(x.shape[0], width)
    out[:, 1:] = x
    return out


def logprobs_of(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, T] log p(input_ids[t] | input_ids[:t]) in float32 (float64 for a float64 model); position 0 is 0."""
    lp = logits_logprobs(_shifted_logits(model, input_ids, attention_mask), input_ids[:, 1:])
    return _scatter_back(lp, input_ids.shape[1])


def logit_grad_proxy_of(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(log-probs [B, T], per-token ‖∂ log p(y_t) / ∂ logits_t‖² [B, T]) from one forward pass.

    ∂ log softmax(z)_y / ∂z = e_y − p, so the squared norm is 1 − 2 p_y + Σ_v p_v² (`proxy_sq_norm`). Summed
    over a trajectory's tokens it is the squared gradient norm of log π(τ) with respect to the logits
    (positions are separate coordinates): the proxy for ‖∇_θ log π(τ)‖² that the cheap OPOB mode uses in
    place of a backward pass per trajectory. Σ_v p_v² is read off the same log-softmax: no backward.
    """
    logits = _shifted_logits(model, input_ids, attention_mask)
    lp = logits_logprobs(logits, input_ids[:, 1:])
    with torch.no_grad():
        gsq = proxy_sq_norm(lp.detach(), logits_sum_p2(logits))
    return _scatter_back(lp, input_ids.shape[1]), _scatter_back(gsq, input_ids.shape[1])
