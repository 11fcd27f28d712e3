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

from agent_rl.learners.megatron import packing
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
    pack: bool = False,
) -> Tensor:
    """[B, T] float32 log p(input_ids[t] | input_ids[:t]) with gradients into this rank's shard.

    Rows are right-padded and attention is causal, so padded positions never influence real
    ones (their log-probs are garbage and must be outside the loss mask). `dense_mask`: pass an
    explicit mask (megatron's local attention); Transformer Engine builds its own. `pack`: run
    the rows' real tokens as one packed sequence (`packing`), which needs `attention_mask`.
    """
    if pack:
        return _packed_logprobs(
            model,
            input_ids,
            attention_mask,
            par=par,
            dense_mask=dense_mask,
            cp_group=cp_group,
            temperature=temperature,
        )
    b, t = input_ids.shape
    ids = pad_to_multiple(input_ids, par.seq_multiple)
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]  # position t predicts token t+1
    s = ids.shape[1]
    cp_rank = torch.distributed.get_rank(cp_group) if par.cp > 1 else 0
    ids, labels = cp_slice(ids, cp_rank, par.cp), cp_slice(labels, cp_rank, par.cp)
    positions = cp_slice(torch.arange(s, device=ids.device).expand(b, s), cp_rank, par.cp)
    mask = torch.ones(s, s, dtype=torch.bool, device=ids.device).triu(1)[None, None] if dense_mask else None
    lp = _token_logprobs(model(ids, positions, mask), labels, temperature)  # logits [B, S_local, V / tp]
    if par.cp > 1:
        from torch.distributed.nn.functional import all_gather

        lp = cp_unslice(list(all_gather(lp.contiguous(), group=cp_group)), par.cp)
    out = lp.new_zeros(b, t)
    out[:, 1:] = lp[:, : t - 1]
    return out


def _token_logprobs(logits: Tensor, labels: Tensor, temperature: float) -> Tensor:
    """[B, S] log p(labels) from vocab-parallel logits [B, S, V / tp], never gathering the vocabulary."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    return -vocab_parallel_cross_entropy(scaled.transpose(0, 1).contiguous(), labels.t().contiguous()).t()


def _packed_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    *,
    par: ParallelConfig,
    dense_mask: bool,
    cp_group,
    temperature: float,
) -> Tensor:
    """megatron_logprobs over one packed sequence: same [B, T] result, no compute spent on row padding."""
    if attention_mask is None:
        raise ValueError("megatron_logprobs(pack=True) needs the attention_mask to find each row's length")
    if dense_mask and par.cp > 1:
        raise ValueError("context parallelism needs Transformer Engine attention (no dense-mask path)")
    device = input_ids.device
    layout = packing.plan(attention_mask, par)
    ids = packing.pack(input_ids, layout)
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]  # across a sequence boundary the label is garbage; unpack never reads it
    pos = packing.positions(layout, device)
    if par.cp > 1:
        cp_rank = torch.distributed.get_rank(cp_group)
        local = packing.thd_partition_index(layout, cp_rank, par.cp).to(device)
        ids, labels, pos = ids[:, local], labels[:, local], pos[:, local]
    if dense_mask:
        lp = _token_logprobs(model(ids, pos, packing.block_causal_mask(layout, device)), labels, temperature)
    else:
        seq_params = packing.packed_seq_params(layout, device)
        lp = _token_logprobs(model(ids, pos, None, packed_seq_params=seq_params), labels, temperature)
    if par.cp > 1:
        from torch.distributed.nn.functional import all_gather

        order = torch.cat([packing.thd_partition_index(layout, r, par.cp) for r in range(par.cp)])
        gathered = torch.cat(list(all_gather(lp.contiguous(), group=cp_group)), dim=1)
        lp = gathered[:, torch.argsort(order).to(device)]
    rows = packing.unpack(lp, layout)  # rows[i, t]: log p(token t+1 | tokens <= t)
    out = rows.new_zeros(rows.shape)
    out[:, 1:] = rows[:, :-1]
    return out
