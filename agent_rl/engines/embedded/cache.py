"""Preallocated KV cache: one (slots, kv_heads, max_seq, head_dim) buffer per layer for keys and values.

A slot belongs to one request while it runs. Allocated once (like gpt-fast's `setup_caches`), so
a decode step never allocates cache memory, and a finished request's slot keeps its keys until it
is reused: a continuation that re-sends the same prefix picks that slot and skips the prefill.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, *, layers: int, slots: int, kv_heads: int, max_seq_len: int, head_dim: int, dtype):
        shape = (slots, kv_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.slots, self.max_seq_len = slots, max_seq_len

    def update(
        self,
        layer: int,
        slots: torch.Tensor,
        dense: bool,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, S, kv, d]) at (slot, position) and return this batch's keys/values [B, kv, key_len, d].

        dense: slots are exactly 0..B-1 in order, so the keys/values are returned as views, without a copy.
        """
        kc, vc = self.k[layer], self.v[layer]
        rows = slots[:, None]  # [B, 1] broadcasts against positions [B, S]
        kc[rows, :, positions] = k  # advanced indices first: the target is [B, S, kv, d]
        vc[rows, :, positions] = v
        if dense:
            n = slots.shape[0]
            return kc[:n, :, :key_len], vc[:n, :, :key_len]
        return kc[slots, :, :key_len], vc[slots, :, :key_len]
