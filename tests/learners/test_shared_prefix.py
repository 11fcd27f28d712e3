"""Shared-prefix packing (agent_rl/learners/shared_prefix.py): rows that begin alike run their common prefix once,
and every row's log-probs and the gradients equal those of the rows packed without sharing."""

from __future__ import annotations

import pytest
import torch

from agent_rl.learners import shared_prefix
from agent_rl.learners.hf_logprobs import HFLogprobs
from tests.learners.test_packed_logprobs import FP32_EPS, _qwen

VOCAB = 96
# A float64 Qwen2 still normalises in float32 (transformers' RMSNorm upcasts to float32 and back), and sharing sums
# the members' gradients before the prefix's norms run their backward (in float32), not after: values and gradients
# carry float32 rounding, per element ~eps32, through dot products of at most 96 terms (vocab 96, hidden 32,
# intermediate 64): ~100 eps32 relative. A member that saw another's suffix, or a misplaced token, differs by ~1e-2.
TOL = 100 * FP32_EPS


def _grouped(groups: list[tuple[int, list[int]]], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows: per group a random prompt of `p` tokens, then each member's own random continuation of
    the given length; the groups' rows interleaved (as a learner's micro-batch sorted by length would hold them)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p, tails in groups:
        prompt = torch.randint(1, VOCAB, (p,), generator=g)
        rows += [torch.cat([prompt, torch.randint(1, VOCAB, (n,), generator=g)]) for n in tails]
    rows = rows[::2] + rows[1::2]
    ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], am[i, : len(r)] = r, 1
    return ids, am


def test_plan_shares_each_groups_prompt_and_keeps_lone_rows_whole() -> None:
    prompt_a, prompt_b = list(range(1, 21)), list(range(50, 62))
    rows = [
        prompt_a + [90, 91],
        [7, 7, 7],
        prompt_b + [1],
        prompt_a + [92],
        prompt_b + [2, 3],
        prompt_a + [90, 5],
    ]
    got = shared_prefix.plan(rows)
    # rows 0 and 5 share 21 tokens (prompt_a + 90), row 3 shares the 20 of prompt_a: one cluster of three over
    # the 20 saves 40, more than {0, 5} over 21 (21) plus row 3 alone
    assert got.saved == 2 * 20 + 1 * 12
    assert len(got.sources) == sum(map(len, rows)) - got.saved
    for b, row in enumerate(
        rows
    ):  # every row's tokens are where the index says, from a row with the same prefix
        for t, i in enumerate(got.index[b]):
            src_row, src_t = got.sources[i]
            assert src_t == t and rows[src_row][t] == row[t]
    assert sum(n * length for _, n, length in got.calls) == len(got.sources)
    assert ("causal", 1, 3) in got.calls  # [7, 7, 7] shares nothing


def test_plan_shares_nothing_below_min_shared_nor_a_whole_row() -> None:
    short = list(range(1, shared_prefix.MIN_SHARED))  # one token short of sharing
    assert shared_prefix.plan([short + [90], short + [91]]).saved == 0
    whole = list(range(1, 30))
    got = shared_prefix.plan([whole, whole, whole + [5]])
    # identical rows share all but their last token: each member keeps one token of its own
    assert got.saved == 2 * 28
    assert all(length >= 1 for kind, _, length in got.calls if kind == "suffix")


@pytest.mark.parametrize("proxy", [False, True])
def test_shared_prefixes_give_the_unshared_log_probs_and_gradients_in_float64(proxy: bool) -> None:
    model = _qwen(torch.float64)
    ids, am = _grouped(
        [(12, [5, 1, 5, 9]), (20, [3, 3]), (4, [6, 2])]
    )  # the last group's prompt is too short
    coef = torch.linspace(-1.5, 2.0, ids.shape[0], dtype=torch.float64)  # a different weight per trajectory
    results = {}
    for share in (False, True):
        f = HFLogprobs(model, pack=True, chunk_tokens=7, share_prefixes=share)
        model.zero_grad()
        out = f.proxy(model, ids, am) if proxy else (f.logprobs(model, ids, am), None)
        ((out[0] * am).sum(-1) * coef).sum().backward()
        results[share] = out, {n: p.grad.clone() for n, p in model.named_parameters()}
    (lp0, gsq0), g0 = results[False]
    (lp1, gsq1), g1 = results[True]
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=TOL * float(lp0.abs().max()))
    if proxy:
        torch.testing.assert_close(gsq1, gsq0, rtol=0, atol=TOL * float(gsq0.abs().max()))
    for name in g0:
        scale = max(1.0, float(g0[name].abs().max()))
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=TOL * scale, msg=name)


def test_shared_prefixes_compute_fewer_tokens() -> None:
    """What it is for: the decoder sees each shared prompt once (counted at its embedding)."""
    model = _qwen(torch.float64)
    ids, am = _grouped([(30, [4, 4, 4, 4]), (30, [2, 6])])
    fns = [HFLogprobs(model, pack=True, share_prefixes=share) for share in (False, True)]
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(o.shape[1]))
    try:
        with torch.no_grad():
            for f in fns:
                f.logprobs(model, ids, am)
    finally:
        hook.remove()
    assert seen == [int(am.sum()), int(am.sum()) - 3 * 30 - 1 * 30]


def test_a_change_in_one_members_suffix_leaves_the_other_members_unchanged() -> None:
    """A suffix that attended to another member's suffix would carry the change into it."""
    model = _qwen(torch.float64)
    f = HFLogprobs(model, pack=True, share_prefixes=True)
    ids, am = _grouped([(16, [6, 6, 6])])
    other = ids.clone()
    row = 1
    n = int(am[row].sum())
    other[row, 16:n] = (other[row, 16:n] + 3) % (VOCAB - 1) + 1
    with torch.no_grad():
        a, b = f.logprobs(model, ids, am), f.logprobs(model, other, am)
    assert not torch.equal(a[row], b[row])
    keep = [r for r in range(ids.shape[0]) if r != row]
    torch.testing.assert_close(a[keep], b[keep], rtol=0, atol=TOL * float(a.abs().max()))


def test_sharing_reads_the_device_once_per_forward_as_without_it() -> None:
    """The rows' tokens come to the host in the same read as their lengths (test_packed_logprobs.py's count)."""
    from benchmarks.host_reads import HostReads

    model = _qwen(torch.float32)
    f = HFLogprobs(model, pack=True, share_prefixes=True)
    ids, am = _grouped([(12, [5, 1, 5]), (10, [3, 3])])
    with HostReads() as reads:
        lp, gsq = f.proxy(model, ids, am)
        (lp * gsq).sum().backward()
    ours = [w for w in reads.where if not w.startswith("transformers/")]
    assert ours == [ours[0]] and ours[0].endswith(" of"), reads.where
