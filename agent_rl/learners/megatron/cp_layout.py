"""Which positions of a packed sequence a context-parallel rank holds (pure index math, no megatron import).

Every sequence's padded span is cut into 2·cp equal chunks; CP rank r holds chunks r and 2cp−1−r
of every sequence, sequences in order: the load balancing for causal attention of megatron's
`get_thd_batch_on_this_cp_rank` (Transformer Engine's `thd_get_partitioned_indices`). Used by the
packing (which tokens a rank runs) and by `attention.SDPAttention` (where every rank's K/V go).
"""

from __future__ import annotations

import torch
from torch import Tensor


def cp_partition_index(bounds: list[int], cp_rank: int, cp: int) -> Tensor:
    """Positions CP rank `cp_rank` of `cp` holds, from the padded sequence boundaries (cu_seqlens_padded)."""
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        chunk = (end - start) // (2 * cp)
        for c in (cp_rank, 2 * cp - 1 - cp_rank):
            parts.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
    return torch.cat(parts)
