"""model.lm_head_fp32 on the Megatron learner in bf16: the decoder's final norm hands the vocab-parallel head its
output in fp32, unrounded (rank.final_norm_in_fp32, rms_norm's `out_dtype`), so the learner's log-probs equal an
fp64 computation of the final norm and the head from the same bf16 weights and the same bf16 input of that norm,
to fp32 roundoff. Without the setting (the norm's output and the head's GEMM in bf16) they do not.

The learner runs as MegatronRank in gloo processes (one rank, and TP=2 with sequence parallelism), right-padded
rows (learner.pack_sequences: false, so the norm's input maps to (row, position) without the pack layout); a
forward hook captures the final norm's input and output.

Float bounds (tests/float_bounds.py's reasoning). Everything below the final norm is the same bf16 computation on
both sides (the norm's captured input), so the difference is the final norm, the head and the log-softmax only:

- ON_ATOL: with the fp32 final norm and head, the learner's log-prob passes through three chained fp32 reductions
  (the norm's mean of H = 64 squares, the head's H-term dot product, the log-sum-exp over V = 320 logits), n <= V
  terms each: drift(V, 3, scale), scale = the largest Σ_i |y_i W_vi| over the batch's tokens and the vocabulary
  (what the norm's and the GEMM's roundings are relative to: a logit before cancellation) plus the largest
  |log p| (what the log-sum-exp and the final z − lse are relative to), both taken from the fp64 reference.
- SEPARATION = 10 · ON_ATOL: without the setting the norm's output is rounded to bf16 (unit roundoff 2^-8, 2^16
  times fp32's 2^-24) and so are the head's logits; a relative rounding δ_i of y_i moves logit v by Σ_i y_i W_vi δ_i,
  about 2^-8/√3 · ‖y ⊙ W_v‖ (independent roundings), orders of magnitude above ON_ATOL. The test does not rest on
  that estimate: it rounds the fp64 reference's norm output to bf16 (the one change a final norm that still rounds
  would make) and checks that this alone moves the log-probs by more than SEPARATION on these tokens, so a learner
  within ON_ATOL cannot be one whose norm rounds.

The head is sharpened (×8, as benchmarks/fp32_head.py's toy model) so the logits have a trained model's magnitude
(|z| up to ~10) instead of a random init's near-uniform ones.
"""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import build_tiny_dir, make_groups, recipe, requires_megatron, spawn_ranks
from float_bounds import drift

from agent_rl.batch import collate
from agent_rl.learners.megatron.rms_norm import rms_norm

pytestmark = requires_megatron

HEAD_SHARPEN = 8.0
LAYOUTS = {"tp1": {}, "tp2-sp": {"tp": 2, "sp": True}}
U_BF16 = 2.0**-8
"""bf16 unit roundoff (8 significant bits)."""
GRAD_RTOL = 2 * (5 * 2 + 3) * U_BF16
"""test_bf16.py's GRAD_RTOL for this 2-layer model: ‖g_bf16 − g_fp32‖ <= 2 · ROUNDINGS · u · ‖g_fp32‖ per tensor,
ROUNDINGS = 5 per layer + 3 bf16 roundings forward and as many backward (with lm_head_fp32 two of them, the
final norm's output and the head's input, are gone: the bound still holds). A gradient that does not reach the
layers below the norm is 100 % off."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    out = build_tiny_dir(tmp_path_factory.mktemp("fp32_norm_tiny"))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not model.config.tie_word_embeddings
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SHARPEN)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def batch(model_dir):
    return collate(make_groups(model_dir, seed=0)).policy


def _spec(model_dir, layout: str, head_fp32: bool, dtype: str = "bfloat16", algorithm: dict | None = None):
    from agent_rl.learners.megatron import megatron_spec

    r = recipe(model_dir, algorithm, backend="megatron", dtype=dtype, pack_sequences=False, **LAYOUTS[layout])
    r = r.model_copy(update={"model": r.model.model_copy(update={"lm_head_fp32": head_fp32})})
    return megatron_spec(r.learner_spec)


def final_norm_worker(rank: int, world: int, port: int, specs: dict, batch, out: str) -> None:
    """One learner rank per spec: the rank's log-probs of `batch` (no gradient), the final norm's input (gathered
    over SP) and output dtype, the bf16 model's final norm and head weights in HF names (TP shards gathered), and
    the metrics of one step and the fp32 gradient it steps with (HF names; its backward runs through the final
    norm); rank 0 saves {name: record}."""
    from gloo_exit import exit_worker
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    from agent_rl.learners._dp import join_rank_group
    from agent_rl.learners.megatron.convert import gather_hf_state_dict
    from agent_rl.learners.megatron.rank import MegatronRank

    torch.set_num_threads(1)
    join_rank_group(rank, world, f"tcp://127.0.0.1:{port}", device="cpu")
    result = {}
    for name, spec in specs.items():
        learner = MegatronRank(spec)
        seen: dict = {}

        def hook(_m, args, y, seen=seen) -> None:
            seen["x"], seen["y_dtype"] = args[0].detach(), y.dtype

        handle = learner.model.decoder.final_layernorm.register_forward_hook(hook)
        with torch.no_grad():
            lp = learner.logprobs(learner.model, batch.input_ids, batch.attention_mask)
        handle.remove()
        x = seen["x"]
        if spec.par.sp:
            x = gather_from_sequence_parallel_region(x.contiguous(), group=learner.groups.tp)
        hf = gather_hf_state_dict(learner.model, learner.shape, tp_group=learner.groups.tp, te=False)
        captured: dict = {}

        def capture(*_unused, learner=learner, captured=captured) -> None:
            grads = {n: p.grad for n, p in learner.fp32_parameters().items()}
            captured["grads"] = gather_hf_state_dict(
                grads, learner.shape, tp_group=learner.groups.tp, te=False
            )

        learner.optimizer.register_step_pre_hook(capture)
        metrics = learner.step([batch])
        result[name] = {
            "logprobs": lp,
            "norm_in": x,
            "norm_out_dtype": seen["y_dtype"],
            "norm_weight": hf["model.norm.weight"],
            "head": hf["lm_head.weight"],
            "eps": learner.shape.norm_eps,
            "metrics": metrics,
            "grads": captured["grads"],
            "ghost": None if learner._step.ghost is None else type(learner._step.ghost).__name__,
        }
    if rank == 0:
        torch.save(result, out)
    exit_worker()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def records(request, model_dir, batch, tmp_path_factory):
    from agent_rl.learners._dp import _free_port

    layout = request.param
    specs = {
        "on": _spec(model_dir, layout, True),
        "off": _spec(model_dir, layout, False),
        "fp32": _spec(model_dir, layout, False, dtype="float32"),
        "ghost": _spec(model_dir, layout, True, algorithm={"opob_norms": "ghost"}),
    }
    world = specs["on"].world
    out = tmp_path_factory.mktemp(f"fp32_norm_{layout}") / "records.pt"
    spawn_ranks(final_norm_worker, (world, _free_port(), specs, batch, str(out)), world)
    return torch.load(out, weights_only=False)


def _reference(rec: dict, batch, round_norm: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """([B, T] fp64 log-probs at the real positions 1..len-1, their mask, the bound's scale) from the captured
    bf16 input of the final norm and the bf16 weights; `round_norm`: the norm's output rounded to bf16 first."""
    x = rec["norm_in"].transpose(0, 1).double()  # [B, S, H]
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rec["eps"]) * rec["norm_weight"].double()
    if round_norm:
        y = y.to(torch.bfloat16).double()
    w = rec["head"].double()  # [V, H]
    b, t = batch.input_ids.shape
    z = y[:, : t - 1] @ w.t()  # position s predicts token s + 1
    lsm = torch.log_softmax(z, -1)
    lp = torch.zeros(b, t, dtype=torch.float64)
    lp[:, 1:] = lsm.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[:, 1:] = batch.attention_mask[:, 1:].bool()
    real = batch.attention_mask[:, : t - 1].bool()
    gemm_scale = torch.einsum("bsh,vh->bsv", y[:, : t - 1].abs(), w.abs()).amax(-1)[real].max().item()
    return lp, mask, gemm_scale + lp[mask].abs().max().item()


def test_the_final_norm_hands_the_head_fp32_only_with_lm_head_fp32(records):
    assert records["on"]["norm_out_dtype"] == torch.float32
    assert records["off"]["norm_out_dtype"] == torch.bfloat16
    assert records["on"]["norm_in"].dtype == torch.bfloat16  # the residual stream stays in the model's dtype


def test_lm_head_fp32_logprobs_equal_the_fp64_final_norm_and_head(records, batch):
    on, off = records["on"], records["off"]
    ref, mask, scale = _reference(on, batch)
    on_atol = drift(on["head"].shape[0], 3, scale)
    separation = 10 * on_atol
    rounded, _, _ = _reference(on, batch, round_norm=True)
    assert (rounded - ref)[mask].abs().max() > separation, "the data cannot tell a rounding norm from fp32"
    err_on = (on["logprobs"].double() - ref)[mask].abs().max().item()
    assert err_on <= on_atol, f"lm_head_fp32: max |log p − fp64| = {err_on:.3g} > {on_atol:.3g}"
    ref_off, _, _ = _reference(off, batch)  # off's own captured norm input and weights
    err_off = (off["logprobs"].double() - ref_off)[mask].abs().max().item()
    assert err_off > separation, (
        f"without lm_head_fp32: max |log p − fp64| = {err_off:.3g} <= {separation:.3g}"
    )


def test_a_step_backpropagates_through_the_fp32_final_norm(records):
    """The bf16 step's fp32 gradient, with the fp32 final norm, equals the fp32 learner's within GRAD_RTOL per
    tensor (its backward takes the fp32 dy into every layer below the norm)."""
    on, ref = records["on"], records["fp32"]
    assert all(math.isfinite(v) for v in on["metrics"].values()), on["metrics"]
    for name, want in ref["grads"].items():
        err = (on["grads"][name] - want).norm() / want.norm()
        assert err <= GRAD_RTOL, f"{name}: ‖g_bf16 − g_fp32‖ / ‖g_fp32‖ = {err:.3g} > {GRAD_RTOL:.3g}"


def test_rms_norm_out_dtype_keeps_fp32_and_its_backward_returns_the_input_dtype():
    """rms_norm(out_dtype=fp32) on bf16: y is the fp32 computation unrounded (within drift(H, 1, |y|) of fp64,
    far below bf16's 2^-8 relative), and the backward of an fp32 dy equal to a bf16 one gives the same dx (bf16)
    and dw bit for bit as the bf16 call: the backward upcasts dy to fp32 first either way. (That dx comes back in
    x's dtype autograd enforces by itself: it casts a Function's gradient to its input's dtype.)"""
    g = torch.Generator().manual_seed(0)
    h = 64
    x = torch.randn(5, 7, h, generator=g).to(torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(5, 7, h, generator=g).to(torch.bfloat16)
    y32 = rms_norm(x, w, 1e-6, out_dtype=torch.float32)
    y16 = rms_norm(x, w, 1e-6)
    assert (y32.dtype, y16.dtype) == (torch.float32, torch.bfloat16)
    xd = x.detach().double()
    want = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.detach().double()
    atol = drift(h, 1, want.abs().max().item())
    assert (y32.double() - want).abs().max() <= atol
    assert (y16.double() - want).abs().max() > 10 * atol  # what the fp32 output keeps
    g32 = torch.autograd.grad((y32 * dy.float()).sum(), (x, w))
    g16 = torch.autograd.grad((y16 * dy).sum(), (x, w))
    for a, b in zip(g32, g16, strict=True):
        assert torch.equal(a, b)


def test_ghost_norms_hook_the_fp32_final_norm(records):
    """opob_norms: ghost with lm_head_fp32 (ghost.py hooks every norm, the final one too, whose output and output
    gradient are now fp32): the same step as the backward per trajectory within test_ghost_megatron.py's
    BF16_RTOL (= GRAD_RTOL here), metrics and gradient."""
    rec, ref = records["ghost"], records["on"]
    assert ref["ghost"] is None and rec["ghost"] == "MegatronGhostNorms"
    for key in ("grad_norm", "traj_grad_norm_mean", "traj_grad_norm_max", "baseline_mean", "ess"):
        assert rec["metrics"][key] == pytest.approx(ref["metrics"][key], rel=GRAD_RTOL), key
    flat = lambda grads: torch.cat([grads[k].flatten() for k in sorted(grads)])  # noqa: E731
    want = flat(ref["grads"])
    err = float((flat(rec["grads"]) - want).norm() / want.norm())
    assert err <= GRAD_RTOL, f"relative gradient error {err:.3g}"
