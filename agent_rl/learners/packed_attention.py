"""Attention over packed trajectories without a [tokens, tokens] mask: causal SDPA one document at a time.

transformers (5.x) packs by position ids: with no attention mask and position ids that restart at 0,
`masking_utils` builds a block-diagonal causal mask for SDPA/eager. That mask is N x N (N = the packed
tokens), and SDPA with an arbitrary mask computes every block of the N x N scores: measured on this CPU,
a packed micro-batch of 4 sorted trajectories stepped 2x slower than the same rows padded
(benchmarks/torch_learner_speed.py). Only variable-length kernels skip the empty blocks, and
flash-attention 2 (transformers' `flash_attention_2`, which reads the same `cu_seq_lens_q` we pass) is a
CUDA-only extra.

So this registers an attention implementation through transformers' own extension points
(`AttentionInterface` and `AttentionMaskInterface`, see transformers' attention_interface docs) that,
given the document boundaries (`cu_seq_lens_q`, FlashAttention's name for them), runs torch's
`scaled_dot_product_attention` with `is_causal=True` on each document: work Σ L_i², memory O(N), and no
token attends across documents. The documents are cut from the packed row with one `split` (a slice per document
had a backward that wrote each document's gradient into a zero tensor of the whole row, summed by autograd:
O(documents x tokens)), and neighbours of one length run as one batched call (fewer, larger calls); on agent_arith's
step this took 0.89x (1 thread) and 0.86x (2 threads) the CPU time of a slice and a call per document, per-round
medians on a shared machine (benchmarks/results/learner_step_agent_arith*.md). Without boundaries (every other call: tests, evaluation) it is
transformers' SDPA unchanged, masks included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from agent_rl.learners.shared_prefix import Call

NAME = "agent_rl_packed_sdpa"


def _attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cu_seq_lens_q: torch.Tensor | None = None,
    packed_bounds: tuple[int, ...] | None = None,
    packed_calls: tuple[Call, ...] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """`packed_bounds`: cu_seq_lens_q as Python ints, when the caller has them (no device sync per layer);
    `packed_calls`: a shared-prefix layout's calls instead (shared_prefix.py)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        packed_calls is None and cu_seq_lens_q is None and packed_bounds is None
    ) or attention_mask is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"{NAME}: packed documents come as one row, got a batch of {query.shape[0]}")
    if packed_calls is not None:
        return _run_calls(module, query, key, value, packed_calls, **kwargs), None
    bounds = list(packed_bounds) if packed_bounds is not None else cu_seq_lens_q.tolist()  # type: ignore[union-attr]
    if torch.compiler.is_compiling():
        # learner.compile: one call per document, sliced out (inductor does not lower SDPA's backward on the batched
        # views of `_rows` under dynamic shapes)
        parts = [
            sdpa_attention_forward(
                module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, **kwargs
            )[0]
            for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return torch.cat(parts, dim=1), None
    runs = equal_runs([e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)])
    return _run_calls(module, query, key, value, tuple(("causal", k, n) for n, k in runs), **kwargs), None


def _run_calls(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    calls: tuple[Call, ...],
    **kwargs: Any,
) -> torch.Tensor:
    """The packed row cut into its calls with one split (not a slice per document: a slice's backward writes its
    gradient into a zero tensor of the whole packed row, one per document, summed by autograd, O(documents x
    tokens); split's backward is one cat). n documents of one length run as a batch of n rows [n, heads, length,
    head_dim], one SDPA call, causal within each. A shared prefix (shared_prefix.py) runs the same way; a run of n
    members' suffixes of s tokens runs as n rows whose keys are the last prefix's then their own, under a [s, P + s]
    mask (all of the prefix, causal over the suffix): the prefix's keys and values go to every member's call, so
    autograd sums its gradient over the members."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sizes = [n * length for _, n, length in calls]
    parts, prefix = [], None
    for (kind, n, length), q, kk, v in zip(
        calls, query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2), strict=True
    ):
        q, kk, v = (_rows(x, n, length) for x in (q, kk, v))
        mask = None
        if kind == "suffix":
            assert prefix is not None, "a suffix call follows its prefix"
            pk, pv = prefix
            kk = torch.cat([pk.expand(n, -1, -1, -1), kk], dim=2)
            v = torch.cat([pv.expand(n, -1, -1, -1), v], dim=2)
            mask = _suffix_mask(length, pk.shape[2], q.device)
        elif kind == "prefix":
            prefix = (kk, v)
        out = sdpa_attention_forward(module, q, kk, v, mask, **kwargs)[0]  # [n, length, heads, head_dim]
        parts.append(out.reshape(1, n * length, *out.shape[2:]))
    return torch.cat(parts, dim=1)


def _suffix_mask(s: int, p: int, device: torch.device) -> torch.Tensor:
    """[1, 1, s, p + s] bool (batch and heads broadcast), True where a suffix token may look: the whole prefix, and
    its suffix up to itself."""
    own = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    return torch.cat([torch.ones(s, p, dtype=torch.bool, device=device), own], dim=1)[None, None]


def _rows(x: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """[1, heads, k * n, d] (k documents of n tokens, one after another) as k rows [k, heads, n, d]."""
    return x if k == 1 else x[0].unflatten(1, (k, n)).transpose(0, 1)


def equal_runs(lengths: list[int]) -> list[tuple[int, int]]:
    """Consecutive documents of the same length as (length, how many), in order: each run is one SDPA call over a
    batch of documents (the learner's rows come sorted longest first, and proxy OPOB's micro-batches group by group
    with each group's rows in that order: a group's members of one length are neighbours)."""
    runs: list[tuple[int, int]] = []
    for n in lengths:
        if runs and runs[-1][0] == n:
            runs[-1] = (n, runs[-1][1] + 1)
        else:
            runs.append((n, 1))
    return runs


def _mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """No mask without padding (the attention is causal per document); transformers' SDPA mask otherwise."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Make NAME known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, _mask)


def use_packed_attention(model: nn.Module) -> bool:
    """Switch `model` (a transformers model using SDPA with full attention in every layer) to NAME; False (the
    model untouched) where it uses another implementation or sliding windows: there transformers' own packing
    applies (flash-attention 2 varlen, or the block-diagonal mask)."""
    config = model.config
    sliding = getattr(config, "sliding_window", None) is not None and (
        getattr(config, "use_sliding_window", True)
        or "sliding_attention" in (getattr(config, "layer_types", None) or ())
    )
    if config._attn_implementation != "sdpa" or sliding:
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
