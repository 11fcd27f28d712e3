"""A packed micro-batch's sequence boundaries kept on the host beside their device copy, so that what reads them as
Python ints does not make the host wait for the device.

Hand-written (no library does this): megatron-core's unfused RoPE for packed (THD) sequences
(`rope_utils._apply_rotary_pos_emb_thd`, what runs without Transformer Engine's fused kernel) reads `cu_seqlens` on
the host on every call, a `.tolist()` of the lengths and a comparison with the rotary table's size, and it is
called for the queries and for the keys of every layer; our attention (`attention.SDPAttention`) reads the same
boundaries once per layer. On a GPU each read waits for every kernel queued before it, about a hundred times per
forward of a 24-layer model, again in each recomputed forward. `to_device` attaches the host tensor to its device
copy; `on_host` returns it (or the tensor itself, for one built elsewhere), and `read_rope_bounds_on_host` makes
megatron's THD RoPE take it: the same values, read without a wait.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

_HOST = "_agent_rl_on_host"


def to_device(host: Tensor, device: torch.device | str) -> Tensor:
    """`host` (a CPU tensor) on `device`, copied without waiting, with `host` attached for `on_host` (a distinct
    tensor also on the CPU, so that a test can tell which one was read)."""
    dev = host.to(device, non_blocking=True)
    if dev is host:
        dev = host.clone()
    setattr(dev, _HOST, host)
    return dev


def on_host(t: Tensor) -> Tensor:
    """The host copy `to_device` attached to `t`, else `t`."""
    return getattr(t, _HOST, t)


def read_rope_bounds_on_host() -> None:
    """Make megatron-core's THD RoPE read `cu_seqlens` from its host copy (idempotent; nothing else changes: it
    uses them only as Python ints and as offsets)."""
    from megatron.core.models.common.embeddings import rope_utils

    original = getattr(rope_utils, "_apply_rotary_pos_emb_thd", None)
    if original is None or getattr(original, "_agent_rl_host_bounds", False):
        return  # another megatron-core layout (tested with 0.16): its RoPE reads what it reads

    @functools.wraps(original)
    def thd_rope(t: Tensor, cu_seqlens: Tensor, *args, **kwargs) -> Tensor:  # noqa: ANN002, ANN003
        return original(t, on_host(cu_seqlens), *args, **kwargs)

    thd_rope._agent_rl_host_bounds = True  # type: ignore[attr-defined]
    rope_utils._apply_rotary_pos_emb_thd = thd_rope
