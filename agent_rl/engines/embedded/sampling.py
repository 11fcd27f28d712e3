"""Per-row sampling with temperature, top-k, top-p and per-request seeds, and the log-prob of what was drawn.

Log-prob semantics (what the learner receives as log μ):
- temperature > 0: log of the probability of the sampled token under the distribution it was
  actually drawn from: softmax(filter(logits / T)), where filter keeps the top-k logits and then
  the smallest top-p nucleus, and renormalises. With T=1, top_p=1, top_k=-1 this is exactly the
  model's log_softmax(logits).
- temperature == 0 (greedy): the sampling distribution is a point mass (log-prob 0 carries no
  information), so we return the model's own log_softmax(logits) at the argmax, as SGLang and
  vLLM do.

Top alternatives (`top_n` > 0, OpenAI's top_logprobs): the n most likely tokens of that same
distribution with their log-probs, most likely first; tokens the filter removed (probability 0)
are never listed, so a row may get fewer than n.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class RowParams:
    """The sampling settings of one running request, plus its private RNG when it asked for a seed."""

    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None
    top_n: int = 0  # also report this many top alternatives per token
    matcher: Any = None  # xgrammar GrammarMatcher of a constrained request (constrained.py)


def filtered_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor
):
    """log softmax(filter(logits / T)) per row. logits: [B, V] fp32; temperature/top_p: [B] float; top_k: [B] int.

    Rows with top_k <= 0 or >= V keep every token; rows with top_p >= 1 skip the nucleus cut.
    """
    vocab = logits.shape[-1]
    x = logits / temperature[:, None]
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k)
    need_k, need_p = bool((k < vocab).any()), bool((top_p < 1.0).any())
    if need_k or need_p:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        if need_k:
            drop |= torch.arange(vocab)[None, :] >= k[:, None]
        if need_p:
            probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
            mass_before = probs.cumsum(-1) - probs
            drop |= mass_before > top_p[:, None]  # the first token always stays: its mass_before is 0
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.log_softmax(x, dim=-1)


TopList = list[tuple[int, float]]


def sample(
    logits: torch.Tensor, rows: list[RowParams], default: torch.Generator
) -> tuple[list[int], list[float], list[TopList | None]]:
    """Draw one token per row; return (tokens, logprobs, top alternatives or None per row) as Python lists."""
    raw = torch.log_softmax(logits, dim=-1)
    tops: list[TopList | None] = [None] * len(rows)
    greedy = [r.temperature == 0.0 for r in rows]
    tokens = raw.argmax(-1)
    logprobs = raw.gather(-1, tokens[:, None])[:, 0]
    rand = [i for i, g in enumerate(greedy) if not g]
    if rand:
        idx = torch.tensor(rand)
        lp = filtered_logprobs(
            logits[idx],
            torch.tensor([rows[i].temperature for i in rand], dtype=logits.dtype),
            torch.tensor([rows[i].top_p for i in rand], dtype=logits.dtype),
            torch.tensor([rows[i].top_k for i in rand]),
        )
        probs = lp.exp()
        drawn = torch.empty(len(rand), dtype=torch.long)
        shared = [j for j, i in enumerate(rand) if rows[i].generator is None]
        if shared:
            drawn[shared] = torch.multinomial(probs[shared], 1, generator=default)[:, 0]
        # Seeded requests draw from their own stream, so their tokens do not depend on the batch around them.
        for j, i in enumerate(rand):
            if rows[i].generator is not None:
                drawn[j] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
        tokens[idx] = drawn
        logprobs[idx] = lp.gather(-1, drawn[:, None])[:, 0]
        for j, i in enumerate(rand):
            if rows[i].top_n > 0:
                tops[i] = _top(lp[j], rows[i].top_n)
    for i, g in enumerate(greedy):
        if g and rows[i].top_n > 0:
            tops[i] = _top(raw[i], rows[i].top_n)
    return tokens.tolist(), logprobs.tolist(), tops


def _top(dist: torch.Tensor, n: int) -> TopList:
    """The n most likely tokens of one row's log-distribution, dropping those it gives probability 0."""
    values, ids = torch.topk(dist, min(n, dist.shape[-1]))
    return [(t, v) for t, v in zip(ids.tolist(), values.tolist(), strict=True) if v != float("-inf")]
