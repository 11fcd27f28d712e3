"""Packed micro-batches of hybrid models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE: Gated DeltaNet + gated attention):
the torch learner's log-probs and gradients of a packed micro-batch equal each trajectory run alone through
transformers' own forward, and no trajectory's conv inputs or recurrent state reach the next one packed after it.

Also the kernels of agent_rl/varlen_delta_rule.py against transformers' torch kernels run per document, with the
initial states a continued sequence brings (the engine's prefill of a next turn)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from float_bounds import drift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))
from sparse_models import HYBRID_ARCHS, randomise_constants, sparse_config  # noqa: E402

from agent_rl.learners import packed_linear_attention  # noqa: E402
from agent_rl.learners.hf_logprobs import HFLogprobs  # noqa: E402
from agent_rl.learners.packed_attention import NAME as PACKED  # noqa: E402
from agent_rl.varlen_delta_rule import causal_conv1d_varlen, chunk_gated_delta_rule_varlen  # noqa: E402

VOCAB = 512
LENGTHS = [70, 9, 130, 3]  # across the rule's 64-token chunks: 2, 1, 3 and 1 chunks
# float32, packed against alone: other matmul shapes and summation orders only. The longest reduction has
# n = 512 terms (the vocabulary's log-sum-exp; the rest are shorter: attention over <= 130 keys, 64-token chunks,
# hidden 64, intermediate 96); a log-prob passes through depth = 53 chained ones (per DeltaNet layer 15: norm,
# projections, conv, q/k L2 norms, the chunk's k·kᵀ system, its triangular solve, the state read and the chunk's
# attention, the state update, the gated norm, out_proj, norm, the MLP's router / gate-up / down; per attention
# layer 10; two of each; then the final norm, the head, the log-sum-exp) of logits of magnitude <= 8.
TOL = drift(512, 53, 8.0)  # 2.3e-3; a leak of one trajectory's state into the next moves log-probs by > 1e-2
# The kernels alone: reductions of at most 64 terms (a chunk), depth 6 (l2 norm, k·kᵀ, solve, state read, the
# chunk's attention, state update) per chunk, three chunks chained through the state; values O(1..10).
KERNEL_TOL = drift(64, 18, 10.0)


@pytest.fixture(scope="module", params=HYBRID_ARCHS)
def hybrid(request):
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(sparse_config(request.param, VOCAB), dtype=torch.float32)
    randomise_constants(model)
    return model.train()


def _batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        am[i, :n] = 1
    return ids, am


def test_the_learner_packs_hybrid_models_with_document_aware_deltanet_layers(hybrid) -> None:
    f = HFLogprobs(hybrid, pack=True)
    assert f.pack and f.attention == PACKED
    layers = [m for m in hybrid.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    assert len(layers) == 2 and all(hasattr(m, "_transformers_forward") for m in layers)


def test_packed_hybrid_micro_batch_equals_each_trajectory_alone_in_values_and_gradients(hybrid) -> None:
    ids, am = _batch(LENGTHS)
    coef = torch.tensor([0.7, -1.3, 0.4, 2.0])  # a different loss weight per trajectory
    f = HFLogprobs(hybrid, pack=True, chunk_tokens=64)
    lp = f.logprobs(hybrid, ids, am)
    hybrid.zero_grad()
    ((lp * am).sum(-1) * coef).sum().backward()
    got = {n: p.grad.clone() for n, p in hybrid.named_parameters() if p.grad is not None}
    hybrid.zero_grad()
    for i, n in enumerate(LENGTHS):
        # one row: nothing packed, transformers' own Gated DeltaNet forward and torch kernels
        alone = f.logprobs(hybrid, ids[i : i + 1, :n], am[i : i + 1, :n])
        worst = float((lp[i, :n] - alone[0]).detach().abs().max())
        assert worst <= TOL, f"trajectory {i} (length {n}): packed differs from alone by {worst:.3g}"
        (alone.sum() * coef[i]).backward()
    assert got.keys() == {n for n, p in hybrid.named_parameters() if p.grad is not None}
    for name, p in hybrid.named_parameters():
        if p.grad is None:
            continue
        scale = max(1.0, float(p.grad.abs().max()))
        excess = float((got[name] - p.grad).abs().max()) - TOL * scale
        assert excess <= 0, f"d {name}: packed differs from alone by {excess:.3g} beyond the bound"
    hybrid.zero_grad()


def test_changing_one_packed_trajectory_leaves_the_later_ones_bit_identical(hybrid) -> None:
    """A conv input or recurrent state that crossed a boundary would carry the change into the next trajectory."""
    f = HFLogprobs(hybrid, pack=True)
    ids, am = _batch([12, 70, 5, 9])
    other = ids.clone()
    other[0, :12] = (other[0, :12] + 5) % (VOCAB - 1) + 1
    other[1, 60:70] = (other[1, 60:70] + 3) % (VOCAB - 1) + 1  # the end of a trajectory: its state at the end
    with torch.no_grad():
        a, b = f.logprobs(hybrid, ids, am), f.logprobs(hybrid, other, am)
    assert not torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1])
    assert torch.equal(a[2:], b[2:])


def _docs(lengths: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    n, hk, hv, dk, dv = sum(lengths), 2, 4, 16, 8
    q, k = torch.randn(n, hk, dk, generator=g), torch.randn(n, hk, dk, generator=g)
    v = torch.randn(n, hv, dv, generator=g)
    gate = -torch.rand(n, hv, generator=g) * 2  # log decay <= 0
    beta = torch.rand(n, hv, generator=g)
    bounds = [0]
    for x in lengths:
        bounds.append(bounds[-1] + x)
    return (q, k, v, gate, beta), tuple(bounds), g


def test_varlen_delta_rule_equals_transformers_kernel_per_document_from_given_states() -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    lengths = [70, 1, 0, 130, 64, 5]  # an empty document keeps its initial state
    inputs, bounds, g = _docs(lengths, 0)
    initial = torch.randn(len(lengths), 4, 16, 8, generator=g)
    out, final = chunk_gated_delta_rule_varlen(*inputs, bounds, initial_state=initial)
    assert out.shape == inputs[2].shape and final.shape == initial.shape
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if a == b:
            assert torch.equal(final[i], initial[i])
            continue
        want, want_final = torch_chunk_gated_delta_rule(
            *(t[None, a:b] for t in inputs), initial_state=initial[i : i + 1], output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        scale = max(1.0, float(want_final.abs().max()))
        assert float((out[a:b] - want[0]).abs().max()) <= KERNEL_TOL * scale, i
        assert float((final[i] - want_final[0]).abs().max()) <= KERNEL_TOL * scale, i


def test_varlen_causal_conv_equals_the_conv_of_each_document_after_its_own_inputs() -> None:
    g = torch.Generator().manual_seed(1)
    lengths, c, kernel = [7, 1, 2, 20], 12, 4
    bounds = (0, 7, 8, 10, 30)
    x, w = torch.randn(30, c, generator=g), torch.randn(c, kernel, generator=g)
    before = torch.randn(len(lengths), c, kernel - 1, generator=g)  # a continued sequence's last inputs
    for initial in (None, before):
        out, last = causal_conv1d_varlen(x, w, bounds, initial)
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            prev = torch.zeros(c, kernel - 1) if initial is None else initial[i]
            seq = torch.cat([prev, x[a:b].t()], dim=1)  # [C, K-1+L]
            want = F.conv1d(seq[None], w[:, None, :], groups=c)[0].t()
            # the same K-term dot products in the same order: equal up to the kernel's vectorisation
            torch.testing.assert_close(out[a:b], want, rtol=0, atol=drift(kernel, 1, 10.0))
            assert torch.equal(last[i], seq[:, -(kernel - 1) :])


def test_a_layer_kind_it_does_not_know_is_left_to_transformers_and_the_learner_pads() -> None:
    """A conv with a bias (no Qwen model has one) is not what the packed forward computes: no packing then."""
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(sparse_config("qwen3_5", VOCAB), dtype=torch.float32)
    layer = next(m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet"))
    layer.conv1d.bias = torch.nn.Parameter(torch.zeros(layer.conv1d.out_channels))
    assert not packed_linear_attention.use_packed_linear_attention(model)
    assert not HFLogprobs(model, pack=True).pack
