"""Per-token log-probs from a Megatron GPTModel shard: vocab-parallel, sequence- and context-parallel.

Same contract as `vcpo.logprobs.logprobs_of` ([B, T] log p(x_t | x_<t), position 0 is 0), so
the VCPO math above it is backend-agnostic. The logits stay split over the vocabulary (TP);
megatron's `vocab_parallel_cross_entropy` takes the log-softmax across ranks without ever
gathering a [T, V] tensor. Sequences are right-padded to a multiple of `ParallelConfig.seq_multiple`
(causal attention: padding at the end changes nothing before it). Under context parallelism a
rank holds 2 of the 2·cp load-balanced chunks; the log-probs are all-gathered differentiably, so
every CP rank computes the same loss and back-propagates into its own chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agent_rl.learners.megatron.model import ParallelConfig


def pad_to_multiple(x: Tensor, multiple: int, value: int | float = 0) -> Tensor:
    """Right-pad the last dim of x to a multiple of `multiple`."""
    extra = (-x.shape[-1]) % multiple
    return torch.nn.functional.pad(x, (0, extra), value=value) if extra else x


def cp_chunk_ids(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two of 2·cp sequence chunks a CP rank holds: r and 2cp−1−r (balances causal attention work)."""
    return cp_rank, 2 * cp - 1 - cp_rank


def cp_slice(x: Tensor, cp_rank: int, cp: int) -> Tensor:
    """This CP rank's part of [B, S] (S divisible by 2·cp), as megatron's get_batch_on_this_cp_rank."""
    if cp == 1:
        return x
    b, s = x.shape[0], x.shape[1]
    chunks = x.reshape(b, 2 * cp, s // (2 * cp), *x.shape[2:])
    return chunks[:, list(cp_chunk_ids(cp_rank, cp))].reshape(b, s // cp, *x.shape[2:])


def cp_unslice(parts: list[Tensor], cp: int) -> Tensor:
    """Inverse of cp_slice over all CP ranks' parts ([B, S/cp] each, in CP rank order) -> [B, S]."""
    b, local = parts[0].shape[0], parts[0].shape[1]
    chunk = local // 2
    order: list[Tensor | None] = [None] * (2 * cp)
    for r, part in enumerate(parts):
        first, second = cp_chunk_ids(r, cp)
        order[first], order[second] = part[:, :chunk], part[:, chunk:]
    return torch.cat(order, dim=1).reshape(b, local * cp)  # type: ignore[arg-type]


def megatron_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    par: ParallelConfig,
    dense_mask: bool,
    cp_group=None,
    temperature: float = 1.0,
) -> Tensor:
    """[B, T] float32 log p(input_ids[t] | input_ids[:t]) with gradients into this rank's shard.

    `attention_mask` is accepted for the vcpo logprob_fn signature: rows are right-padded and
    attention is causal, so padded positions never influence real ones (their log-probs are
    garbage and must be outside the loss mask). `dense_mask`: pass an explicit causal mask
    (megatron's local attention); Transformer Engine builds its own.
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    b, t = input_ids.shape
    ids = pad_to_multiple(input_ids, par.seq_multiple)
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]  # position t predicts token t+1
    s = ids.shape[1]
    cp_rank = torch.distributed.get_rank(cp_group) if par.cp > 1 else 0
    ids, labels = cp_slice(ids, cp_rank, par.cp), cp_slice(labels, cp_rank, par.cp)
    positions = cp_slice(torch.arange(s, device=ids.device).expand(b, s), cp_rank, par.cp)
    mask = torch.ones(s, s, dtype=torch.bool, device=ids.device).triu(1)[None, None] if dense_mask else None
    logits = model(ids, positions, mask)  # [B, S_local, V / tp]
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    lp = -vocab_parallel_cross_entropy(scaled.transpose(0, 1).contiguous(), labels.t().contiguous()).t()
    if par.cp > 1:
        from torch.distributed.nn.functional import all_gather

        lp = cp_unslice(list(all_gather(lp.contiguous(), group=cp_group)), par.cp)
    out = lp.new_zeros(b, t)
    out[:, 1:] = lp[:, : t - 1]
    return out
