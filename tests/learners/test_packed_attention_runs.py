"""Packed attention's runs (documents cut from the packed row with one split, neighbours of one length as one batched
SDPA call): what the learner computes is what it computed before (one SDPA call per document, sliced out:
benchmarks/learner_step_agent_arith.py keeps that code as its baseline). The same arithmetic on the same values; the
bounds allow what an attention kernel may round differently when it blocks a batch of documents otherwise."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agent_rl.learners.hf_logprobs import HFLogprobs
from agent_rl.learners.packed_attention import NAME as PACKED
from agent_rl.learners.packed_attention import equal_runs
from benchmarks.learner_step_agent_arith import slice_per_document, use_reference
from tests.float_bounds import EPS32, EPS64, drift

# groups of 4 in the order proxy OPOB hands them over (group by group, each sorted longest first): equal lengths both
# side by side (7, 7 / 12, 12, 12) and apart (12 in two groups), and a document of one token
LENGTHS = [12, 12, 7, 7, 12, 9, 5, 1, 15, 12, 7, 3]


def test_equal_runs_join_neighbours_of_one_length_only() -> None:
    assert equal_runs([12, 12, 7, 7, 12, 9, 9, 9, 1]) == [(12, 2), (7, 2), (12, 1), (9, 3), (1, 1)]
    assert equal_runs([]) == []
    assert equal_runs([4]) == [(4, 1)]


def _model(dtype: torch.dtype) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, use_cache=False)  # fmt: skip
    return Qwen2ForCausalLM(cfg).to(dtype).train()


def _rows(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, 96, (n,), generator=g)
        am[i, :n] = 1
    return ids, am


def _logprobs_and_grads(model, f: HFLogprobs, ids, am, coef, *, reference: bool):
    from transformers import AttentionInterface

    from agent_rl.learners import packed_attention

    AttentionInterface.register(PACKED, slice_per_document if reference else packed_attention._attention)
    try:
        model.zero_grad()
        lp = f.logprobs(model, ids, am)
        ((lp * am).sum(-1) * coef).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    finally:
        AttentionInterface.register(PACKED, packed_attention._attention)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_runs_and_length_order_give_the_log_probs_and_gradients_of_one_call_per_document(dtype) -> None:
    model = _model(dtype)
    f = HFLogprobs(model, pack=True, chunk_tokens=7)
    assert f.attention == PACKED
    ids, am = _rows(LENGTHS)
    coef = torch.linspace(-1.5, 2.0, len(LENGTHS), dtype=dtype)  # a different loss weight per trajectory
    lp, grads = _logprobs_and_grads(model, f, ids, am, coef, reference=False)
    ref_lp, ref_grads = _logprobs_and_grads(model, f, ids, am, coef, reference=True)
    eps = EPS64 if dtype == torch.float64 else EPS32
    # A log-prob goes through the same operations on the same values; an attention kernel may reduce a batched
    # document's scores in another order: at most 17 chained reductions (float_bounds.logprob_atol's count) of at most
    # 96 terms (the widest: vocab 96, intermediate 64) of log-probs ~ log 96, rounded anew.
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=drift(96, 17, math.log(96), eps=eps))
    n_tokens = int(am.sum())
    for name, g in grads.items():
        # a weight's gradient sums every token's contribution (n_tokens of them), each carrying that rounding, over 17
        # chained reductions, at the scale of the largest term
        scale = max(1.0, float(ref_grads[name].abs().max()))
        tol = drift(n_tokens, 17, scale, eps=eps)
        torch.testing.assert_close(g, ref_grads[name], rtol=0, atol=tol, msg=name)


def _groups(model_dir: Path) -> list:
    """3 prompts x 4 samples, sampled turns of 3 or 6 tokens after prompts of 5, 5 and 8 tokens: equal lengths within
    a group and across groups (runs both side by side and apart); behaviour log-probs from the weights."""
    from agent_rl.types import Group, Trajectory
    from tests.learners.learner_helpers import behaviour_logprobs

    g = torch.Generator().manual_seed(1)
    plan = [(gi, i, torch.randint(3, 100, (p,), generator=torch.Generator().manual_seed(gi)).tolist(),
             torch.randint(3, 100, (n,), generator=g).tolist())
            for gi, (p, ns) in enumerate([(5, [6, 3, 6, 3]), (5, [6, 6, 3, 6]), (8, [3, 3, 3, 6])])
            for i, n in enumerate(ns)]  # fmt: skip
    lps = behaviour_logprobs(model_dir, [prompt + resp for _, _, prompt, resp in plan])
    groups: dict[int, list] = {}
    for (gi, i, prompt, resp), lp in zip(plan, lps, strict=True):
        t = Trajectory(uid=f"g{gi}-{i}", group_id=f"g{gi}", prompt_ids=prompt, reward=float((gi + i) % 2))
        t.append_sampled(resp, lp[len(prompt) :], 0)
        groups.setdefault(gi, []).append(t)
    return [Group(f"g{gi}", ts) for gi, ts in groups.items()]


def test_a_learner_step_learns_what_it_learned_before(tmp_path: Path) -> None:
    """One TorchRank step (agent_arith's algorithm: VCPO, proxy OPOB, one micro-batch of whole groups) with the runs
    against the code before: per-row results, loss, gradients and updated weights."""
    from agent_rl.batch import collate
    from agent_rl.tools.tiny import build_tiny, sample_corpus
    from benchmarks.learner_step_agent_arith import rank

    model_dir = build_tiny(tmp_path / "m", sample_corpus(), vocab_size=128, hidden=32, layers=2, seed=0)
    batch = collate(_groups(model_dir), sort_by_length=True).policy
    out = {}
    for reference in (True, False):
        rk = rank(model_dir, 64)  # the same weights from the same directory; common prefixes not shared
        grads: dict[str, torch.Tensor] = {}  # what the optimizer steps on (after clipping)
        rk.optimizer.register_step_pre_hook(
            lambda *_, rk=rk, grads=grads: grads.update(
                {n: p.grad.clone() for n, p in rk.model.named_parameters()}
            )
        )
        use_reference(reference)
        try:
            metrics = rk.step(batch)
        finally:
            use_reference(False)
        out[reference] = (
            metrics,
            rk.last_rows(),
            grads,
            {k: v.clone() for k, v in rk.model.state_dict().items()},
        )
    w0 = {k: v.clone() for k, v in rank(model_dir, 64).model.state_dict().items()}
    (m0, rows0, g0, w_ref), (m1, rows1, g1, w_new) = out[True], out[False]
    n_tokens = int(batch.attention_mask.sum())
    lp_tol = drift(512, 17, 8.0)  # float_bounds.logprob_atol: float32 log-probs of a tiny model, rounded anew
    torch.testing.assert_close(rows1.logprobs, rows0.logprobs, rtol=0, atol=lp_tol)
    # per-row sums over at most T loss tokens of those log-probs (float_bounds.sum_atol's random walk)
    t = batch.input_ids.shape[1]
    torch.testing.assert_close(rows1.seq_log_weight, rows0.seq_log_weight, rtol=0, atol=math.sqrt(t) * lp_tol)
    assert abs(m1["loss"] - m0["loss"]) <= math.sqrt(t) * lp_tol * max(1.0, abs(m0["loss"]))
    for name, g in g1.items():
        scale = max(1.0, float(g0[name].abs().max()))
        torch.testing.assert_close(g, g0[name], rtol=0, atol=drift(n_tokens, 17, scale), msg=name)
    # AdamW's first step moves each weight by lr·g/(|g| + ε) (bias-corrected moments): two gradients g0, g1 give moves
    # apart by at most 2·lr·|g1 − g0| / (max(|g0|, |g1|) + ε); plus the weight's own rounding
    lr, adam_eps = m0["lr"], 1e-8
    assert abs(m1["lr"] - lr) <= 1e-6 * lr  # the ESS-scaled lr: the same weights up to rounding
    for name, w in w_new.items():
        a, b = g0[name], g1[name]
        bound = (
            2 * lr * (b - a).abs() / (torch.maximum(a.abs(), b.abs()) + adam_eps) + 4 * EPS32 * w0[name].abs()
        )
        assert bool(((w - w_ref[name]).abs() <= bound + 1e-6 * lr).all()), name
        assert not torch.equal(w, w0[name]) or not bool(
            b.any()
        )  # the step moved every weight with a gradient
