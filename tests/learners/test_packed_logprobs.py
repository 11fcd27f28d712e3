"""The torch learner's log-probs: chunked linear-log-softmax and packed micro-batches give what each trajectory
gives alone (values and gradients), attention never crosses trajectories, and no [tokens, vocab] float32
tensor is ever made."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agent_rl.learners.hf_logprobs import HFLogprobs
from agent_rl.learners.packed_attention import NAME as PACKED
from benchmarks.host_reads import HostReads, cuda_syncs
from vcpo.logprobs import linear_logprobs, logit_grad_proxy_of, logprobs_of

FP32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7
FP64_EPS = torch.finfo(torch.float64).eps  # 2.2e-16
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
    ),
]


def _qwen(dtype: torch.dtype, vocab: int = 96) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, use_cache=False)  # fmt: skip
    return Qwen2ForCausalLM(cfg).to(dtype).train()


def _batch(vocab: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows of random tokens with the given lengths (padding id 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
        am[i, :n] = 1
    return ids, am


@pytest.mark.parametrize("chunk", [1, 5, 64, 10_000])
def test_linear_logprobs_equal_the_full_log_softmax_and_its_gradients_in_float64(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    n, h, v = 37, 8, 50
    hidden = torch.randn(n, h, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(v, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    upstream = torch.randn(
        n, dtype=torch.float64, generator=g
    )  # a different weight per token, as RL losses have
    lp, p2 = linear_logprobs(hidden, weight, targets, bias=bias, chunk_tokens=chunk, with_sum_p2=True)
    got = torch.autograd.grad((lp * upstream).sum(), (hidden, weight, bias))
    logp = torch.log_softmax(hidden @ weight.t() + bias, -1)
    want_lp = logp.gather(-1, targets[:, None]).squeeze(-1)
    want = torch.autograd.grad((want_lp * upstream).sum(), (hidden, weight, bias))
    # float64, same operations in another grouping: rounding of sums over v = 50 logits and n = 37 tokens,
    # ~ (v + n) * eps relative to the magnitudes (all O(1..10) here)
    tol = 100 * (v + n) * FP64_EPS
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=tol)
    torch.testing.assert_close(p2, logp.exp().pow(2).sum(-1), rtol=0, atol=tol)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_linear_logprobs_under_bf16_autocast_run_the_matmul_in_bf16_and_the_softmax_in_fp32() -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (20,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp = linear_logprobs(hidden, weight, targets, chunk_tokens=6)
        ref_logits = torch.nn.functional.linear(hidden, weight)  # what nn.Linear does under autocast
    assert lp.dtype == torch.float32 and ref_logits.dtype == torch.bfloat16
    want = ref_logits.detach().float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    # both round the same fp32-accumulated dot products to bf16; chunking may change the accumulation order:
    # one bf16 ulp (2^-8 relative) of the largest logit, twice (the target's logit and the log-sum-exp)
    bound = 2 * 2**-8 * float(ref_logits.detach().float().abs().max())
    assert float((lp.detach() - want).abs().max()) <= bound
    lp.sum().backward()
    assert hidden.grad is not None and weight.grad is not None and weight.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_linear_logprobs_gradients_under_bf16_autocast_match_autograd_through_the_full_logits(
    device: str,
) -> None:
    """The backward forms each chunk's softmax in bf16 and scales it in place (two bf16 roundings of the logits'
    gradient); autograd through nn.Linear + an fp32 log-softmax rounds that gradient once. Both feed bf16
    matmuls; a missing target term, a wrong sign or a wrong upstream gradient is off by O(1) of the scale."""
    g = torch.Generator().manual_seed(2)
    n, h, v = 30, 16, 48
    hidden = torch.randn(n, h, generator=g).to(device).requires_grad_()
    weight = torch.randn(v, h, generator=g).to(device).requires_grad_()
    bias = torch.randn(v, generator=g).to(device).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    upstream = torch.randn(n, generator=g).to(device)  # a different weight per token, as RL losses have
    with torch.autocast(device, dtype=torch.bfloat16):
        lp = linear_logprobs(hidden, weight, targets, bias=bias, chunk_tokens=7)
        got = torch.autograd.grad((lp * upstream).sum(), (hidden, weight, bias))
        logits = torch.nn.functional.linear(hidden, weight, bias)
        ref_lp = logits.float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
        want = torch.autograd.grad((ref_lp * upstream).sum(), (hidden, weight, bias))
    z = logits.detach().float()
    dz = upstream[:, None] * (torch.nn.functional.one_hot(targets, v) - z.softmax(-1))  # exact, fp32
    wb, hb = weight.detach().bfloat16().float(), hidden.detach().bfloat16().float()
    # |error of each dz entry| <= (3 roundings of 2^-9: ours twice, autograd's once, + the logits' own
    # rounding, which chunking may change: one bf16 ulp of z and of the log-sum-exp moves p by 2 * 2^-8 * |z|max
    # relative) * |dz|; then each product's rounding to bf16 (2^-9, both sides). Propagated through the
    # matmuls: |dz| @ |w| for d_h, |dz|^T @ |h| for d_w, the column sums for d_b.
    rel = 3 * 2**-9 + 2 * 2**-8 * float(z.abs().max()) + 2 * 2**-9
    bounds = (rel * dz.abs() @ wb.abs(), rel * dz.abs().t() @ hb.abs(), rel * dz.abs().sum(0))
    for name, a, b, bound in zip(("hidden", "weight", "bias"), got, want, bounds, strict=True):
        excess = ((a - b).abs() - bound).max()
        assert excess <= 0, f"d_{name}: off by {excess:.3g} beyond its bound"


@pytest.mark.parametrize("device", DEVICES)
def test_linear_logprobs_backward_under_bf16_makes_no_float32_chunk_by_vocab_tensor(device: str) -> None:
    """Backward turns each chunk's bf16 logits into their gradient in bf16: no fp32 [chunk, V] copy (the forward
    keeps one, for the log-softmax's precision)."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(24, 8, generator=g).to(device).requires_grad_()
    weight = torch.randn(40, 8, generator=g).to(device).requires_grad_()
    targets = torch.randint(0, 40, (24,), generator=g).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        lp = linear_logprobs(hidden, weight, targets, chunk_tokens=6)
    with _LargestVocabTensor(40) as seen:
        lp.sum().backward()
    # the fp32 [V, H] gradient accumulator of the weight has H = 8 columns, not V
    assert seen.rows == 0, f"backward made an fp32 tensor of {seen.rows} rows x vocab"


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [
        # float64: the packed and the alone forward round differently (other matmul shapes, other sums)
        (torch.float64, 1e3 * FP64_EPS),
        # float32: per operation the relative rounding is at most ~K u for a dot product of length K (K <= 96
        # here: vocab 96, hidden 32, intermediate 64, and the attention over <= 23 keys); a log-prob passes
        # through ~20 such operations (2 layers x q/k/v/o/mlp, norms, head, log-sum-exp) of O(1) values, and
        # log-probs are O(log 96) = 4.6: 20 * 96 * u * 4.6 ~ 1e-3 worst case, per gradient element alike
        (torch.float32, 1e-3),
    ],
    ids=["float64", "float32"],
)
def test_packed_micro_batch_equals_each_trajectory_alone_in_values_and_gradients(dtype, tol) -> None:
    model = _qwen(dtype)
    ids, am = _batch(96, [23, 9, 16, 1 + 1])
    coef = torch.tensor([0.7, -1.3, 0.4, 2.0], dtype=dtype)  # a different loss weight per trajectory
    packed = HFLogprobs(model, pack=True, chunk_tokens=7)
    assert packed.attention == PACKED
    lp = packed.logprobs(model, ids, am)
    model.zero_grad()
    ((lp * am).sum(-1) * coef).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for i in range(ids.shape[0]):
        n = int(am[i].sum())
        alone = packed.logprobs(model, ids[i : i + 1, :n], am[i : i + 1, :n])  # one row: nothing packed
        torch.testing.assert_close(lp[i, :n], alone[0], rtol=0, atol=tol)
        assert torch.all(lp[i, n:] == 0) and lp[i, 0] == 0  # padding and position 0 have no log-prob
        (alone.sum() * coef[i]).backward()
    for name, p in model.named_parameters():
        scale = max(1.0, float(p.grad.abs().max()))
        torch.testing.assert_close(got[name], p.grad, rtol=0, atol=tol * scale, msg=name)


def test_changing_one_packed_trajectory_leaves_the_others_log_probs_unchanged() -> None:
    """Attention that crossed documents would carry the change into the trajectories packed after it."""
    model = _qwen(torch.float64)
    f = HFLogprobs(model, pack=True)
    ids, am = _batch(96, [12, 10, 8])
    other = ids.clone()
    other[0, :12] = (other[0, :12] + 5) % 95 + 1
    with torch.no_grad():
        a, b = f.logprobs(model, ids, am), f.logprobs(model, other, am)
    assert not torch.equal(a[0], b[0])
    assert torch.equal(a[1:], b[1:])


def test_packed_and_padded_learner_log_probs_equal_the_reference_and_the_proxy_too() -> None:
    """vcpo.logprobs_of / logit_grad_proxy_of (the model's own logits, right-padded rows) are the reference."""
    model = _qwen(torch.float64)
    ids, am = _batch(96, [15, 4, 11])
    with torch.no_grad():
        ref_lp, ref_gsq = logit_grad_proxy_of(model, ids, am)
        assert torch.equal(ref_lp, logprobs_of(model, ids, am))
        real = am.clone()
        real[:, 0] = 0  # position 0 and padding carry nothing
        for pack in (True, False):
            lp, gsq = HFLogprobs(model, pack=pack, chunk_tokens=4).proxy(model, ids, am)
            torch.testing.assert_close(lp * real, ref_lp * real, rtol=0, atol=1e3 * FP64_EPS)
            torch.testing.assert_close(gsq * real, ref_gsq * real, rtol=0, atol=1e3 * FP64_EPS)
            assert torch.all(gsq[real == 0] == 0)


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("lengths", [[15, 4, 11], [7, 12, 3, 9, 5, 1, 14, 8]])
def test_the_learners_log_probs_read_the_device_once_per_forward_and_not_in_backward(pack, lengths) -> None:
    """On a GPU each read waits for the device: once for the rows' lengths (and whether they are right-padded),
    whatever the rows; the packed layout is built on the host from them. transformers' mask preprocessing adds
    its own read (`find_packed_sequence_indices`, which the transformers + Liger anchor makes too); nothing else."""
    model = _qwen(torch.float32)
    fn = HFLogprobs(model, pack=pack, chunk_tokens=4)
    ids, am = _batch(96, lengths)
    with HostReads() as reads:
        lp, gsq = fn.proxy(model, ids, am)
        (lp * gsq).sum().backward()
    ours = [w for w in reads.where if not w.startswith("transformers/")]
    assert ours == [ours[0]] and ours[0].endswith(" of"), reads.where
    assert reads.functions <= {"of", "find_packed_sequence_indices"}, reads.where


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_on_cuda_the_learners_log_probs_sync_twice_per_forward_and_not_in_backward() -> None:
    """The same, counted by torch's sync debug mode on the device."""
    model = _qwen(torch.float32).cuda()
    fn = HFLogprobs(model, pack=True, chunk_tokens=4)
    ids, am = (t.cuda() for t in _batch(96, [7, 12, 3, 9, 5, 1, 14, 8]))
    fn.proxy(model, ids, am)[0].sum().backward()  # warm
    with cuda_syncs() as syncs:
        lp, gsq = fn.proxy(model, ids, am)
        (lp * gsq).sum().backward()
    assert len(syncs) <= 2, syncs


class _LargestVocabTensor(TorchDispatchMode):
    """Records the most rows of any float32 tensor with `vocab` columns that an operator allocates."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view (the head's weight transposed, [hidden, vocab]) allocates nothing
            return out
        for t in out if isinstance(out, tuple | list) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float32
                and t.dim() >= 2
                and t.shape[-1] == self.vocab
            ):
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


@pytest.mark.parametrize("opob_mode", ["exact", "proxy"])
def test_a_learner_step_never_makes_a_float32_tokens_by_vocab_tensor(tiny_model_dir, opob_mode) -> None:
    from learner_helpers import make_groups, recipe_for

    from agent_rl.learners import build

    chunk = 8
    learner = build(
        recipe_for(
            tiny_model_dir,
            learner={"device": "cpu", "logprob_chunk_tokens": chunk},
            algorithm={"opob_mode": opob_mode},
        ).learner_spec
    )
    groups = make_groups(tiny_model_dir, n_groups=2, n=2)
    vocab = learner.local.model.config.vocab_size
    tokens = sum(len(t) for g in groups for t in g.trajectories)
    assert tokens > 4 * chunk
    with _LargestVocabTensor(vocab) as seen:
        learner.step(groups)
    assert 0 < seen.rows <= chunk, f"a float32 [{seen.rows}, {vocab}] tensor (chunk {chunk}, {tokens} tokens)"


@pytest.mark.slow  # inductor compiles C++ for the forward and the backward: minutes on 2 cores
@pytest.mark.heavy  # 36 s of make test's budget (CI recorded 1643 of its 1800 s on 2026-11-28): CI's second job
def test_the_compiled_decoder_gives_the_eager_log_probs_and_gradients() -> None:
    model = _qwen(torch.float32)
    ids, am = _batch(96, [14, 9, 9, 5])  # two documents of one length: eager runs them as one attention call
    out = {}
    for compiled in (False, True):
        f = HFLogprobs(model, pack=True, compile=compiled)
        model.zero_grad()
        lp = f.logprobs(model, ids, am)
        (lp * am).sum().backward()
        out[compiled] = lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    # inductor fuses and reorders fp32 arithmetic: the float32 bound of the packed-vs-alone test
    torch.testing.assert_close(out[True][0], out[False][0], rtol=0, atol=1e-3)
    for n, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][n], g, rtol=0, atol=1e-3 * max(1.0, float(g.abs().max())))
