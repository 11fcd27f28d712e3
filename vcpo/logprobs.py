"""Per-token log-probs of a causal LM, and the forward-only proxy for ‖∇log π(τ)‖².

Both take any module called as ``model(input_ids, attention_mask=...)`` whose output has
``.logits`` [B, T, V] (Hugging Face causal LMs). Trainers with another model interface pass
their own function of the same signature to the driver.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _shifted_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    # Right padding needs no mask in a causal LM: padding only follows the real tokens, which
    # never attend forward, so their logits are the same; without a mask the attention kernel
    # takes its fast causal path (about 2x faster on CPU here). Other padding keeps the mask.
    am = attention_mask > 0
    right_padded = not bool((am[:, 1:] & ~am[:, :-1]).any())
    logits = (
        model(input_ids).logits if right_padded else model(input_ids, attention_mask=attention_mask).logits
    )
    logits = logits[:, :-1]  # position t-1 predicts token t
    return logits if logits.dtype == torch.float64 else logits.float()  # bf16 logits lose the tail


def _scatter_back(x: Tensor, width: int) -> Tensor:
    out = x.new_zeros(x.shape[0], width)
    out[:, 1:] = x
    return out


def logprobs_of(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, T] log p(input_ids[t] | input_ids[:t]) in float32 (float64 for a float64 model); position 0 is 0."""
    logp_all = _shifted_logits(model, input_ids, attention_mask).log_softmax(-1)
    lp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return _scatter_back(lp, input_ids.shape[1])


def logit_grad_proxy_of(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(log-probs [B, T], per-token ‖∂ log p(y_t) / ∂ logits_t‖² [B, T]) from one forward pass.

    ∂ log softmax(z)_y / ∂z = e_y − p, so the squared norm is 1 − 2 p_y + Σ_v p_v². Summed
    over a trajectory's tokens it is the squared gradient norm of log π(τ) with respect to
    the logits (positions are separate coordinates): the proxy for ‖∇_θ log π(τ)‖² that
    the cheap OPOB mode uses in place of a backward pass per trajectory. Σ_v p_v² is read
    off the log-softmax the log-probs need anyway: one extra elementwise pass, no backward.
    """
    logp_all = _shifted_logits(model, input_ids, attention_mask).log_softmax(-1)
    lp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    with torch.no_grad():
        sum_p2 = logp_all.mul(2.0).exp_().sum(-1)
        gsq = (1.0 - 2.0 * lp.exp() + sum_p2).clamp(min=0.0)
    return _scatter_back(lp, input_ids.shape[1]), _scatter_back(gsq, input_ids.shape[1])
