"""Preallocated KV cache: one (slots, kv_heads, max_seq, head_dim) buffer per layer for keys and values.

A slot belongs to one request while it runs. Allocated once (like gpt-fast's `setup_caches`), so
a decode step never allocates cache memory, and a finished request's slot keeps its keys until it
is reused: a continuation that re-sends the same prefix picks that slot and skips the prefill.
The scheduler keeps the running requests in slots 0..n-1 (`swap` moves a slot's contents), so a
forward's rows are a contiguous range of slots and attention reads keys and values in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agent_rl.engines.embedded.moe import RoutingTable
    from agent_rl.engines.embedded.shapes import Step


class KVCache:
    routes: RoutingTable | None = None  # MoE models: the experts each cached position was routed to (moe.py)

    def __init__(self, *, layers: int, slots: int, kv_heads: int, max_seq_len: int, head_dim: int, dtype):
        shape = (slots, kv_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.slots, self.max_seq_len, self.head_dim = slots, max_seq_len, head_dim

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def usable_prefix(self, cached: list[int], prompt: list[int]) -> int:
        """How many leading tokens of `prompt` a slot holding `cached` can skip: keys of any shared prefix."""
        n = min(len(cached), len(prompt))
        i = 0
        while i < n and cached[i] == prompt[i]:
            i += 1
        return i

    def update(
        self, layer: int, step: Step, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, S, kv, d]) at each row's positions; return the rows' keys/values [B, kv, key_len, d] (views)."""
        kc, vc, d = self.k[layer], self.v[layer], self.head_dim
        kc.view(-1, d).index_copy_(0, step.write, k.reshape(-1, d))
        vc.view(-1, d).index_copy_(0, step.write, v.reshape(-1, d))
        rows = slice(step.start, step.start + step.batch)
        return kc[rows, :, : step.key_len], vc[rows, :, : step.key_len]

    @property
    def forkable(self) -> bool:
        """Whether a slot's first positions can be copied to another slot (`fork`): true for keys and values."""
        return True

    def fork(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst` in every layer (a shared prompt's keys)."""
        for buf in (*self.k, *self.v):
            buf[dst, :, :length] = buf[src, :, :length]
        if self.routes is not None:
            self.routes.fork(src, dst, length)

    def swap(self, a: int, b: int, length: int) -> None:
        """Exchange the first `length` positions of slots a and b in every layer."""
        if a == b or length <= 0:
            return
        for buf in (*self.k, *self.v):
            tmp = buf[a, :, :length].clone()
            buf[a, :, :length] = buf[b, :, :length]
            buf[b, :, :length] = tmp
