"""Attention without Transformer Engine (attention.SDPAttention) and the chunked log-prob head (linear_logprobs):
the same numbers as the plain math, packed trajectories never attend across each other, context parallelism at
CP=2 equals CP=1, and what autograd keeps for backward grows linearly in the sequence length."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import (
    build_tiny_dir,
    make_groups,
    packed_and_alone_worker,
    requires_megatron,
    saved_bytes_worker,
    spawn_ranks,
)

from agent_rl.batch import collate

pytestmark = requires_megatron

FP32_EPS = 2.0**-23
TOKENS = 120
"""Upper bound on the tokens of the test batch (make_groups: 6 trajectories of 13-28 tokens): the longest sum a
weight gradient takes, so its fp32 rounding error is at most TOKENS · FP32_EPS relative (first order)."""
GRAD_RTOL = TOKENS * FP32_EPS
LOGPROB_TOL = 1e-5
"""Log-probs: a few fp32 roundings of values below 10 in magnitude through two layers (as the other megatron tests)."""


def _reference_attention(q, k, v, scale, past):
    """Plain softmax attention with repeated K/V heads: query i sees keys 0 .. past + i."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    lq, lk = q.shape[2], k.shape[2]
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=past)
    return scores.masked_fill(~allowed, -math.inf).softmax(-1) @ v


@pytest.mark.parametrize("past", [0, 8])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (14, 2)], ids=["mha", "gqa-14-2"])
def test_causal_attention_equals_softmax_attention_with_repeated_kv(heads, kv_heads, past):
    from agent_rl.learners.megatron.attention import causal_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, 12, 16, generator=g, dtype=torch.float64).float().requires_grad_()
    k = torch.randn(2, kv_heads, 12 + past, 16, generator=g).requires_grad_()
    v = torch.randn(2, kv_heads, 12 + past, 16, generator=g).requires_grad_()
    up = torch.randn(2, heads, 12, 16, generator=g)
    got = causal_attention(q, k, v, scale=0.25, past=past)
    grads = torch.autograd.grad((got * up).sum(), (q, k, v))
    want = _reference_attention(q, k, v, 0.25, past)
    want_grads = torch.autograd.grad((want * up).sum(), (q, k, v))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_linear_logprobs_equal_log_softmax_of_the_full_logits(temperature, monkeypatch):
    """Chunked (3 tokens per chunk here) output layer + log-softmax: the same values and gradients as the full
    [tokens, V] fp32 log-softmax."""
    from agent_rl.learners.megatron import linear_logprobs as ll

    monkeypatch.setattr(ll, "LOGIT_CHUNK_BYTES", 3 * 4 * 50)  # 3 tokens of a 50-word vocabulary per chunk
    g = torch.Generator().manual_seed(0)
    h = torch.randn(11, 1, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (11, 1), generator=g)
    up = torch.randn(11, 1, generator=g)
    got = ll.linear_logprobs(h, w, labels, temperature=temperature)
    grads = torch.autograd.grad((got * up).sum(), (h, w))
    full = ((h @ w.t()) / temperature).log_softmax(-1).gather(-1, labels[..., None])[..., 0]
    want_grads = torch.autograd.grad((full * up).sum(), (h, w))
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_linear_logprobs_in_bf16_have_the_full_log_softmax_gradients_within_bf16_rounding(
    temperature, monkeypatch
):
    """bf16 weights (megatron's bf16 mode): backward forms each chunk's softmax in bf16 and scales it in place (two
    roundings of the logits' gradient, and z / T rounded to bf16 once), autograd through the full fp32 log-softmax
    rounds it once. A missing target term, a wrong sign or temperature is off by O(1) of the scale."""
    from agent_rl.learners.megatron import linear_logprobs as ll

    monkeypatch.setattr(ll, "LOGIT_CHUNK_BYTES", 3 * 4 * 50)  # 3 tokens of a 50-word vocabulary per chunk
    g = torch.Generator().manual_seed(1)
    h = torch.randn(11, 1, 8, generator=g).bfloat16().requires_grad_()
    w = torch.randn(50, 8, generator=g).bfloat16().requires_grad_()
    labels = torch.randint(0, 50, (11, 1), generator=g)
    up = torch.randn(11, 1, generator=g)
    got = torch.autograd.grad((ll.linear_logprobs(h, w, labels, temperature=temperature) * up).sum(), (h, w))
    z = (h @ w.t()).float() / temperature
    want = torch.autograd.grad((z.log_softmax(-1).gather(-1, labels[..., None])[..., 0] * up).sum(), (h, w))
    zd = z.detach()[:, 0]
    dz = up[:, 0, None] * (torch.nn.functional.one_hot(labels[:, 0], 50) - zd.softmax(-1)) / temperature
    # |error of each dz entry| <= (3 roundings of 2^-9: ours twice, autograd's once; the logits rounded apart,
    # in other chunk shapes and after z / T: a bf16 ulp of z / T and of the log-sum-exp moves p by
    # 3 * 2^-8 * |z / T|max relative) * |dz|; each product's rounding to bf16 (2^-9, both sides)
    rel = 3 * 2**-9 + 3 * 2**-8 * float(zd.abs().max()) + 2 * 2**-9
    bounds = (rel * dz.abs() @ w.detach().float().abs(), rel * dz.abs().t() @ h.detach()[:, 0].float().abs())
    for name, a, b, bound in zip(("h", "w"), got, want, bounds, strict=True):
        excess = ((a.float().reshape(bound.shape) - b.float().reshape(bound.shape)).abs() - bound).max()
        assert excess <= 0, f"d_{name}: off by {excess:.3g} beyond its bound"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_dir(tmp_path_factory.mktemp("attn_tiny"))


@pytest.fixture(scope="module")
def batch(model_dir):
    b = collate(make_groups(model_dir, seed=0)).policy
    assert int(b.attention_mask.sum()) <= TOKENS
    return b


LAYOUTS = {"tp1": {}, "tp2-sp": {"tp": 2, "sp": True}, "cp2": {"cp": 2}}


@pytest.fixture(scope="module")
def packed_and_alone(model_dir, batch, tmp_path_factory):
    from agent_rl.learners._dp import _free_port
    from agent_rl.learners.megatron.model import ParallelConfig

    out = {}
    for name, layout in LAYOUTS.items():
        par = ParallelConfig(**layout)
        world = par.tp * par.cp
        path = tmp_path_factory.mktemp(name) / "out.pt"
        spawn_ranks(
            packed_and_alone_worker,
            (world, _free_port(), str(model_dir), par, batch, str(path)),
            world,
        )
        out[name] = torch.load(path)
    return out


def _assert_grads_close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, g in want.items():
        err = float((got[name] - g).norm()) / max(float(g.norm()), 1e-30)
        assert err <= GRAD_RTOL or float(g.norm()) == 0.0, f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packed_batch_logprobs_and_gradients_equal_each_trajectory_alone(packed_and_alone, batch, layout):
    """Trajectories of different lengths in one packed sequence: every log-prob, and the gradient of their sum,
    equal what each trajectory gives alone (nothing attends across a trajectory boundary)."""
    (lp_pack, g_pack), (lp_alone, g_alone) = (
        packed_and_alone[layout]["packed"],
        packed_and_alone[layout]["alone"],
    )
    lengths = batch.attention_mask.sum(-1)
    assert int(lengths.min()) < int(lengths.max())
    real = batch.attention_mask.bool().clone()
    real[:, 0] = False
    torch.testing.assert_close(lp_pack[real], lp_alone[real], rtol=LOGPROB_TOL, atol=LOGPROB_TOL)
    assert sum(float(g.norm()) for g in g_pack.values()) > 0.1
    _assert_grads_close(g_pack, g_alone)


def test_context_parallel_2_equals_cp_1(packed_and_alone, batch):
    """CP=2 (K/V all-gathered, load-balanced chunks, bottom-right causal per chunk) gives the log-probs and the
    full-model gradient of CP=1."""
    real = batch.attention_mask.bool().clone()
    real[:, 0] = False
    (lp_cp, g_cp), (lp_1, g_1) = packed_and_alone["cp2"]["packed"], packed_and_alone["tp1"]["packed"]
    torch.testing.assert_close(lp_cp[real], lp_1[real], rtol=LOGPROB_TOL, atol=LOGPROB_TOL)
    _assert_grads_close(g_cp, g_1)


def test_saved_activations_grow_linearly_in_sequence_length(model_dir, tmp_path):
    """Bytes autograd keeps for backward at S, 2S and 4S tokens (one trajectory): a + b·S exactly when nothing is
    quadratic, so (saved(4S) − saved(S)) / (saved(2S) − saved(S)) = 3; [heads, S, S] scores or a mask would make it
    approach 5. Counted by storage, so it is the same on every machine (no allocator or timing in it)."""
    from agent_rl.learners._dp import _free_port

    lengths = [512, 1024, 2048]
    out = tmp_path / "saved.pt"
    spawn_ranks(saved_bytes_worker, (1, _free_port(), str(model_dir), lengths, str(out)), 1)
    s1, s2, s4 = (torch.load(out)[n] for n in lengths)
    assert s1 < s2 < s4
    assert (s4 - s1) / (s2 - s1) == pytest.approx(3.0, abs=0.01)
