"""Packing variable-length trajectories into one sequence for the Megatron learner.

A micro-batch arrives as right-padded rows [B, T]; trajectories in RL differ in length by
an order of magnitude, so the padded layout wastes most of its compute on padding. Packing
concatenates the rows' real tokens into one sequence [1, S] (S = Σ lengths plus the little
padding the parallel layout needs) and keeps sequences apart in attention with megatron's
THD format: `PackedSeqParams` with cu_seqlens, which Transformer Engine's attention
and `attention.SDPAttention` (one causal attention per sequence) both take; RoPE restarts at
every sequence (megatron's THD rotary path), so each row sees exactly what it sees alone.

Padding: under context parallelism every sequence is padded to a multiple of
`ParallelConfig.seq_multiple` (each CP rank holds chunks r and 2cp−1−r *of every sequence*,
as Transformer Engine's `thd_get_partitioned_indices`); otherwise only the pack's total is
padded (to tp under sequence parallelism), by lengthening the last sequence's padding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from agent_rl.learners.megatron.cp_layout import cp_partition_index
from agent_rl.learners.megatron.host_bounds import to_device
from agent_rl.learners.megatron.model import ParallelConfig


@dataclass(frozen=True)
class PackLayout:
    """Where each row of the micro-batch lives in the packed sequence."""

    lengths: tuple[int, ...]  # real tokens of each row
    starts: tuple[int, ...]  # offset of each row in the pack
    padded: tuple[int, ...]  # each row's span in the pack (its length plus its padding)
    width: int  # T of the right-padded rows the layout came from

    @property
    def total(self) -> int:
        return sum(self.padded)

    def cu_seqlens(self, *, padded: bool, device: torch.device | str = "cpu") -> Tensor:
        """int32 [B+1] sequence boundaries, as Transformer Engine's THD attention takes them, with their host copy
        attached (`host_bounds.on_host` reads it without waiting for the device)."""
        sizes = self.padded if padded else self.lengths
        host = torch.tensor(list(itertools.accumulate(sizes, initial=0)), dtype=torch.int32)
        return to_device(host, device)


def row_lengths(attention_mask: Tensor) -> list[int]:
    """Real tokens per row of a right-padded [B, T] mask; any other mask shape is refused. One read of the device
    (the lengths and the check together)."""
    sums = attention_mask.sum(-1, keepdim=True)
    expect = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < sums
    *lengths, wrong = torch.cat([sums[:, 0], (attention_mask.bool() != expect).any().reshape(1)]).tolist()
    if wrong:
        raise ValueError("packing needs right-padded rows (attention_mask = 1…1 0…0 in every row)")
    if min(lengths) < 1:
        raise ValueError(f"packing: row {lengths.index(min(lengths))} has no tokens")
    return [int(n) for n in lengths]


def plan(attention_mask: Tensor, par: ParallelConfig) -> PackLayout:
    """The packed layout of a right-padded micro-batch under `par`."""
    return plan_of_lengths(row_lengths(attention_mask), attention_mask.shape[1], par)


def plan_of_lengths(lengths: list[int], width: int, par: ParallelConfig) -> PackLayout:
    """The packed layout of rows of these real lengths (host ints), right-padded to `width`, under `par`."""
    per_seq = par.seq_multiple if par.cp > 1 else 1
    padded = [n + (-n) % per_seq for n in lengths]
    padded[-1] += (-sum(padded)) % par.seq_multiple
    starts = itertools.accumulate(padded[:-1], initial=0)
    return PackLayout(tuple(lengths), tuple(starts), tuple(padded), width)


def pack(rows: Tensor, layout: PackLayout, fill: int = 0) -> Tensor:
    """[B, T, ...] right-padded -> [1, S, ...] packed (padding positions hold `fill`)."""
    out = rows.new_full((1, layout.total, *rows.shape[2:]), fill)
    for i, (start, n) in enumerate(zip(layout.starts, layout.lengths, strict=True)):
        out[0, start : start + n] = rows[i, :n]
    return out


def unpack(packed: Tensor, layout: PackLayout) -> Tensor:
    """[1, S] -> [B, T] right-padded with zeros; differentiable (gradients flow to the packed tensor)."""
    rows = [
        torch.nn.functional.pad(packed[0, start : start + n], (0, layout.width - n))
        for start, n in zip(layout.starts, layout.lengths, strict=True)
    ]
    return torch.stack(rows)


def positions(layout: PackLayout, device: torch.device | str = "cpu") -> Tensor:
    """[1, S] position ids restarting at 0 for every sequence (RoPE under THD)."""
    return torch.cat([torch.arange(n, device=device) for n in layout.padded])[None]


def thd_partition_index(layout: PackLayout, cp_rank: int, cp: int) -> Tensor:
    """Pack positions this CP rank holds: chunks r and 2cp−1−r of every sequence, sequences in order.

    The same positions as Transformer Engine's `thd_get_partitioned_indices(cu_seqlens_padded, S, cp, r)`,
    which megatron's `get_thd_batch_on_this_cp_rank` uses; written out so that it is tested on CPU.
    """
    return cp_partition_index(list(itertools.accumulate(layout.padded, initial=0)), cp_rank, cp)


def packed_seq_params(layout: PackLayout, device: torch.device | str):
    """megatron `PackedSeqParams` (THD) for Transformer Engine attention and RoPE."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu, cu_padded = (
        layout.cu_seqlens(padded=False, device=device),
        layout.cu_seqlens(padded=True, device=device),
    )
    longest = max(layout.padded)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
