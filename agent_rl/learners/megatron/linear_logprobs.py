"""Token log-probs straight from the final hidden states: output layer + vocab-parallel log-softmax, in chunks.

    log p(y_i) = z_{i,y_i} / T − logsumexp_v(z_{i,v} / T),   z_i = W h_i,   W: this TP rank's [V / tp, H]

Megatron's path (output_layer, then `vocab_parallel_cross_entropy`) holds the [tokens, V / tp]
logits, casts them to fp32 and keeps an fp32 softmax of that size for backward: for one
32k-token trajectory of a 152k vocabulary that is 20 GB at tp=1, more than the rest of the
step. Here the logits exist one chunk of tokens at a time, in forward and again in backward:
forward keeps only h, W, each token's log-prob and this rank's share of its softmax sum ([tokens]
each); backward recomputes each chunk's logits (one extra GEMM of the output layer, ~9 % of the
FLOPs of the 0.5B shape) and turns them into dh and dW: the softmax over this rank's shard straight
from the logits in the model's dtype, scaled in place per token by the shard's share and the
upstream gradient, the target's entry written from the log-prob (as `vcpo.logprobs` does). The
same trade as Apple's Cut Cross-Entropy and Liger's fused linear cross-entropy; hand-written
because both compute a mean loss over the whole vocabulary on one device, while this needs
per-token log-probs (any upstream gradient, temperature) over a vocabulary split across TP ranks
(two all-reduces per chunk: the max, then Σexp and the target logit together; backward needs
none).

Precision: each chunk's logits are the GEMM in the model's dtype, then fp32 for the forward's softmax
(as megatron's cross entropy casts them); in bf16 the backward rounds the logits' gradient to bf16
twice (the softmax, the scaling) instead of once, and z / T once (T != 1): 2^-8 relative, the order
of the bf16 GEMMs it feeds. dW is accumulated over chunks in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from agent_rl.learners.memory import MEGATRON_LOGIT_CHUNK_BYTES as LOGIT_CHUNK_BYTES

# LOGIT_CHUNK_BYTES: fp32 bytes of one chunk's logits [chunk, V / tp] (the memory model's constant).


def chunk_tokens(vocab_local: int) -> int:
    return max(1, LOGIT_CHUNK_BYTES // (4 * vocab_local))


def _chunk_logits(h: Tensor, weight: Tensor, temperature: float):
    """(start, end, fp32 logits / T of tokens start:end) for each chunk of tokens."""
    n, step = h.shape[0], chunk_tokens(weight.shape[0])
    for a in range(0, n, step):
        b = min(a + step, n)
        z = (h[a:b] @ weight.t()).float()
        if temperature != 1.0:
            z /= temperature
        yield a, b, z


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, temperature: float, vocab_start: int, group):
        n, v_local = h.shape[0], weight.shape[0]
        local = labels - vocab_start
        owned = (local >= 0) & (local < v_local)
        local = torch.where(owned, local, torch.zeros_like(local))
        lp, lse, shard = (torch.empty(n, dtype=torch.float32, device=h.device) for _ in range(3))
        for a, b, z in _chunk_logits(h, weight, temperature):
            m = z.max(dim=-1).values
            if group is not None:
                dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
            z -= m[:, None]
            target = z.gather(1, local[a:b, None])[:, 0] * owned[a:b]
            sums = torch.stack([z.exp_().sum(dim=-1), target])
            own = sums[0].log()  # before the all-reduce: log Σ over this rank's vocabulary
            if group is not None:
                dist.all_reduce(sums, group=group)
            lse[a:b] = m + sums[0].log()
            shard[a:b] = own - sums[0].log()  # the shard's share of the full sum, in log
            lp[a:b] = sums[1] - sums[0].log()
        ctx.save_for_backward(h, weight, local, owned, lp, lse, shard)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(lse)
        return lp, lse

    @staticmethod
    def backward(ctx, grad: Tensor, _lse_grad: Tensor | None):
        h, weight, local, owned, lp, lse, shard = ctx.saved_tensors
        t = ctx.temperature
        dh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        dw = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if ctx.needs_input_grad[1]
            else None
        )
        step = chunk_tokens(weight.shape[0])
        for a in range(0, h.shape[0], step):
            b = min(a + step, h.shape[0])
            g = grad[a:b].float()
            # d lp / d z = (onehot(y) − p) / T times the upstream gradient g, p = softmax(z / T) over the whole
            # vocabulary; the target's entry from the forward's log-prob, g (1 − p_y) = −g expm1(lp), exact in
            # fp32 where p_y is near 1
            z = h[a:b] @ weight.t()
            if t != 1.0:
                z /= t
            if z.dtype == torch.float32:  # p = exp(z / T − lse) in place: one [chunk, V / tp] buffer
                dz = z.sub_(lse[a:b, None]).exp_().mul_((-g / t)[:, None])
            else:  # z / T − lse would round to bf16: the softmax over this rank's shard straight from the
                # logits (fp32 inside the kernel) times the shard's share of the full sum, scaled in place
                dz = z.softmax(-1).mul_((-g * shard[a:b].exp() / t)[:, None])
            col = local[a:b, None]  # no device sync: a token whose target another rank owns keeps its entry
            target = torch.where(owned[a:b], g * -torch.expm1(lp[a:b]) / t, dz.gather(1, col)[:, 0].float())
            dz.scatter_(1, col, target[:, None].to(dz.dtype))
            if dh is not None:
                dh[a:b] = dz @ weight
            if dw is not None:
                dw.add_(dz.t() @ h[a:b])  # into fp32 without an fp32 copy of the [V / tp, H] product
        return dh, None if dw is None else dw.to(weight.dtype), None, None, None, None


@dataclass(frozen=True)
class HeadCall:
    """One call of the output head, as an observer (`observe`) sees it: the hidden states as the head took them
    ([s·b, H], gathered over the sequence under SP, in megatron's sequence-major order), this rank's weight
    shard [V / tp, H] and its first vocabulary id, the labels [s·b], the log-probs [s·b] (with their graph) and
    the full vocabulary's log-sum-exp of z / T [s·b] (no graph)."""

    hidden: Tensor
    weight: Tensor
    vocab_start: int
    labels: Tensor
    logprobs: Tensor
    lse: Tensor
    temperature: float


def linear_logprobs(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    tp_group=None,
    sequence_parallel: bool = False,
    observe: Callable[[HeadCall], None] | None = None,
) -> Tensor:
    """[s, b] fp32 log p(labels) from the final norm's output [s (/ tp under SP), b, H] and this rank's output
    weight [V / tp, H]. The hidden states enter as megatron's ColumnParallelLinear takes them: gathered over the
    sequence under SP (backward: reduce-scatter), else copied to the TP region (backward: all-reduce).
    `observe`: called with the head's inputs and outputs (the ghost norms' head rule, ghost.py)."""
    from megatron.core import tensor_parallel

    tp = dist.get_world_size(tp_group) if tp_group is not None else 1
    if sequence_parallel:
        hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, group=tp_group)
    elif tp > 1:
        hidden = tensor_parallel.copy_to_tensor_model_parallel_region(hidden, group=tp_group)
    s, b = hidden.shape[0], hidden.shape[1]
    vocab_start = (dist.get_rank(tp_group) if tp > 1 else 0) * weight.shape[0]
    flat = hidden.reshape(s * b, hidden.shape[2])
    flat_labels = labels.reshape(s * b)
    lp, lse = _LinearLogprobs.apply(
        flat, weight, flat_labels, temperature, vocab_start, tp_group if tp > 1 else None
    )
    if observe is not None:
        observe(HeadCall(flat, weight, vocab_start, flat_labels, lp, lse, temperature))
    return lp.view(s, b)
