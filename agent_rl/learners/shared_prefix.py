"""Shared-prefix packing: trajectories of a micro-batch that begin with the same tokens run those tokens once.

A group's samples start from one prompt (GRPO-style groups: 8 samples of one task), and an agent's prompt (system
prompt, tool schemas, the task) is often most of a short trajectory: on agent_arith about half of the learner's
input tokens are prompts repeated 8 times. Packed with their prefix shared, the decoder computes the prefix once
and each member's suffix attends to it: every token's hidden state is the one it has alone (same positions, same
keys), so log-probs and gradients equal the unshared ones up to float rounding (the prefix's gradient is the sum
of its members', which autograd forms). The same idea as Prefix Grouper (Liu et al. 2025, "Prefix Grouper:
Efficient GRPO Training through Shared-Prefix Forward"); hand-written here because it is a layout over our packed
attention (packed_attention.py), not a dependency.

`plan` sorts the rows lexicographically (rows with a common prefix become neighbours), then chooses where to cut
the sorted rows into clusters by dynamic programming over the tokens saved: a cluster of m rows whose common prefix
is P tokens saves (m - 1) P. A cluster shares only if P >= MIN_SHARED (a heuristic, not measured: a shorter prefix
saves a few tokens for extra attention calls) and P is shorter than each member (every member keeps a token of its own). The packed
row is cluster after cluster: a lone row as it is, a shared cluster as its prefix, then each member's suffix.
`Calls` tells the attention what to run (packed_attention.py): causal documents, a prefix, and runs of members'
suffixes of one length attending to the last prefix and causally to themselves.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

MIN_SHARED = 8  # tokens; a shorter common prefix is not shared
WINDOW = 256  # the most rows one cluster may hold (bounds the planning's work at B x WINDOW)

# one attention call over a run of packed tokens: (kind, n, length); kind "causal": n documents of `length` tokens
# each, causal within each; "prefix": one shared prefix of `length` tokens, causal; "suffix": n members' suffixes of
# `length` tokens each, each attending to the last prefix and causally to itself
Call = tuple[Literal["causal", "prefix", "suffix"], int, int]


@dataclass(frozen=True)
class SharedLayout:
    """Where each packed token comes from and what the attention runs, for the rows `plan` was given."""

    sources: list[tuple[int, int]]  # per packed token: (row, position in the row)
    index: list[list[int]]  # per row, per position < its length: that token's place in the packed row
    calls: tuple[Call, ...]
    saved: int  # tokens not computed because shared


def plan(rows: list[list[int]]) -> SharedLayout:
    """The packed layout of `rows` (each row its real tokens) with common prefixes shared."""
    order = sorted(range(len(rows)), key=lambda b: rows[b])
    # each sorted row's common prefix with the row before it
    lcp = [0] + [_common(rows[a], rows[b]) for a, b in itertools.pairwise(order)]
    clusters = _cut(order, lcp, [len(rows[b]) for b in order])
    sources: list[tuple[int, int]] = []
    index: list[list[int]] = [[0] * len(r) for r in rows]
    calls: list[Call] = []
    saved = 0
    for members, p in clusters:
        if p == 0:  # a lone row
            (b,) = members
            _place(sources, index, b, range(len(rows[b])))
            n = len(rows[b])
            if calls and calls[-1][0] == "causal" and calls[-1][2] == n:
                calls[-1] = ("causal", calls[-1][1] + 1, n)
            else:
                calls.append(("causal", 1, n))
            continue
        start = len(sources)
        _place(sources, index, members[0], range(p))
        for b in members[1:]:
            index[b][:p] = range(start, start + p)
        calls.append(("prefix", 1, p))
        for b in members:
            n = len(rows[b]) - p
            _place(sources, index, b, range(p, len(rows[b])))
            if calls[-1][0] == "suffix" and calls[-1][2] == n:
                calls[-1] = ("suffix", calls[-1][1] + 1, n)
            else:
                calls.append(("suffix", 1, n))
        saved += (len(members) - 1) * p
    return SharedLayout(sources, index, tuple(calls), saved)


def _place(sources: list[tuple[int, int]], index: list[list[int]], b: int, positions: range) -> None:
    for t in positions:
        index[b][t] = len(sources)
        sources.append((b, t))


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cut(order: list[int], lcp: list[int], lengths: list[int]) -> list[tuple[list[int], int]]:
    """Clusters of consecutive sorted rows and their shared prefix length (0: a lone row), most tokens saved.
    best[j]: the most saved by rows order[:j]; a cluster order[i:j] shares P = min(lcp[i+1:j], lengths[i:j] - 1)."""
    n = len(order)
    best, cut = (
        [0] * (n + 1),
        [(0, 0)] * (n + 1),
    )  # cut[j]: (i, P) of the last cluster of the best for order[:j]
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)
        p = lengths[j - 1] - 1
        for i in range(j - 2, max(-1, j - 1 - WINDOW), -1):  # the cluster order[i:j]
            p = min(p, lcp[i + 1], lengths[i] - 1)
            if p < MIN_SHARED:
                break
            if best[i] + (j - 1 - i) * p > best[j]:
                best[j], cut[j] = best[i] + (j - 1 - i) * p, (i, p)
    out: list[tuple[list[int], int]] = []
    j = n
    while j > 0:
        i, p = cut[j]
        out.append((order[i:j], p))
        j = i
    return out[::-1]
