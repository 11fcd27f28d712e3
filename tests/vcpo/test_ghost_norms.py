"""Ghost norms (vcpo/ghost.py): each trajectory's squared gradient norm, layer by layer, equals the one its own
backward gives, and exact OPOB built on them (opob_norms='ghost') makes the update the per-trajectory exact OPOB
makes; on Qwen2, Qwen3 (q/k norms) and Qwen3-MoE (fused experts, router) shapes, packed and padded, fp32 and bf16
autocast, with and without activation recompute. Unsupported layers and tied weights are refused by name.

Float bounds (tests/float_bounds.py's reasoning, written once here):

- LAYER_RTOL32, one layer's ‖∇_layer f_i‖² from the same forward graph, fp32: both sides sum the same products
  x_t,j·γ_t,k in another order (the reference's weight gradient: T terms per entry; the ghost form: d-term Gram
  entries, then T² of them), n ≤ T·d = 14·96 terms, two chained reductions, and squaring doubles a relative
  error: 2·drift(14·96, 2, 1) = 3.5e-5 relative to the layer's norm (a sum of squares: no cancellation).
- LAYER_RTOL16, the same under bf16 autocast: the reference's weight gradient leaves autocast's matmul rounded
  to bf16 once per entry (relative u = 2^-8), the ghost form keeps fp32 products of the same bf16 operands: a
  squared norm moves by at most 2u + u², plus the fp32 bound.
- STEP_RTOL32, the whole update ‖Δ‖/‖update‖, fp32, ghost step vs per-trajectory step: the two run the forward in
  other layouts (a packed row vs one row per trajectory) and the backward in other groupings, through 17 chained
  reductions of ≤ 512 terms forward and as many backward: 2·drift(512, 34, 1) = 3.7e-4.
- STEP_RTOL16, the same under bf16 autocast: each side's weight-gradient entries are rounded to bf16 (u = 2^-8)
  once (the ghost step's one weighted backward) or once per trajectory before an fp32 sum (the reference); the
  update's norm moves by at most 2u, plus the fp32 bound. (A wrong baseline, a missing layer's norm or a missing
  trajectory moves the update by O(1e-2) or more at these sizes: the mutants in the report.)
"""

from __future__ import annotations

import math

import pytest
import torch
from float_bounds import drift
from torch import nn

from agent_rl.learners.hf_logprobs import HFLogprobs
from vcpo import PolicyBatch, Step, StepConfig
from vcpo.ghost import GhostNorms, GhostUnsupported

U16 = 2.0**-8
LAYER_RTOL32 = 2 * drift(14 * 96, 2, 1.0)
LAYER_RTOL16 = 2 * U16 + U16 * U16 + LAYER_RTOL32
STEP_RTOL32 = 2 * drift(512, 34, 1.0)
STEP_RTOL16 = 2 * U16 + STEP_RTOL32
VOCAB, WIDTH = 96, 14


def _model(family: str, seed: int = 0) -> nn.Module:
    from transformers import (
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )  # fmt: skip

    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=48, tie_word_embeddings=False)  # fmt: skip
    if family == "qwen2":
        m = Qwen2ForCausalLM(Qwen2Config(**kw))
    elif family == "qwen3":
        m = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **kw))
    else:
        cfg = Qwen3MoeConfig(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, **kw)
        m = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():  # norm scales away from 1 and biases away from 0: a dropped term then shows
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.2)
    return m.train()


def _batch(model: nn.Module, b: int = 6, per_group: int = 3, seed: int = 1) -> PolicyBatch:
    """Rows of random length (right padded), loss on tokens 3.., stale behaviour log-probs, rewards in [0, 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, WIDTH), generator=g)
    lengths = torch.randint(WIDTH // 2, WIDTH + 1, (b,), generator=g)
    pos = torch.arange(WIDTH)[None]
    am = (pos < lengths[:, None]).long()
    lm = ((pos >= 3) & (am > 0)).float()
    with torch.no_grad():
        cur = HFLogprobs(model, pack=False).logprobs(model, ids, am)
    blp = torch.where(lm > 0, (cur + 0.4 * torch.randn(b, WIDTH, generator=g)).clamp(max=0.0), 0.0)
    gid = torch.arange(b // per_group).repeat_interleave(per_group)
    return PolicyBatch(ids, am, lm, blp, torch.rand(b, generator=g), gid)


def _logprob_fn(lp: HFLogprobs, bf16: bool):
    def fn(model: nn.Module, ids: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return lp.logprobs(model, ids, am)

    return fn


# the default suite runs one case per family that together take every value of every axis; the full matrix is slow
QUICK = {("qwen2", True, False, True), ("qwen3", False, True, False), ("moe", True, True, True)}
CASES = [
    pytest.param(fam, pack, bf16, ckpt, id=f"{fam}-{'packed' if pack else 'padded'}-{'bf16' if bf16 else 'fp32'}"
                 f"{'-recompute' if ckpt else ''}", marks=() if (fam, pack, bf16, ckpt) in QUICK else pytest.mark.slow)
    for fam in ("qwen2", "qwen3", "moe")
    for pack in (True, False)
    for bf16 in (False, True)
    for ckpt in (False, True)
]  # fmt: skip


@pytest.mark.parametrize(("family", "pack", "bf16", "ckpt"), CASES)
def test_each_layers_ghost_norm_equals_the_per_trajectory_gradient_norm(
    family: str, pack: bool, bf16: bool, ckpt: bool
) -> None:
    model = _model(family)
    if ckpt:
        model.activation_checkpointing_enable()
    batch = _batch(model)
    lp = HFLogprobs(model, pack=pack)
    params = [p for p in model.parameters() if p.requires_grad]
    by_layer: dict[str, torch.Tensor] = {}
    ghost = GhostNorms(model, params, head=lp.head, head_input=lp.decoder, by_layer=by_layer)
    lengths = batch.attention_mask.sum(-1).tolist()
    with ghost.capture(batch.input_ids, batch.loss_mask, lengths):
        logp = _logprob_fn(lp, bf16)(model, batch.input_ids, batch.attention_mask)
        f_i = (logp * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1)
        total = ghost.norms(f_i.sum(), retain_graph=True)
    owner = {id(p): name.rsplit(".", 1)[0] for name, p in model.named_parameters()}
    want = {name: torch.zeros(batch.size, dtype=torch.float64) for name in by_layer}
    for i in range(batch.size):  # the reference: trajectory i's own gradient, from the same graph
        for p, g in zip(params, torch.autograd.grad(f_i[i], params, retain_graph=True), strict=True):
            want[owner[id(p)]][i] += g.double().pow(2).sum()
    assert set(by_layer) == {owner[id(p)] for p in params}, "a layer's norm is missing"
    rtol = LAYER_RTOL16 if bf16 else LAYER_RTOL32
    for name, got in by_layer.items():
        torch.testing.assert_close(got, want[name], rtol=rtol, atol=0.0, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(total, sum(want.values()), rtol=rtol, atol=0.0)


def _update(
    family: str,
    batch: PolicyBatch,
    norms: str,
    pack: bool,
    bf16: bool,
    ckpt: bool,
    mbs: int = 6,
    hold: bool = False,
):
    """The step's gradient (−parameter change of SGD lr=1, no clipping or lr damping) and its metrics."""
    model = _model(family)
    if ckpt:
        model.activation_checkpointing_enable()
    lp = HFLogprobs(model, pack=pack)
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    cfg = StepConfig(
        ess_lr_rule="none", grad_clip=1e9, is_truncation=1.5, opob_norms=norms, micro_batch_size=mbs
    )
    step = Step(model, torch.optim.SGD(model.parameters(), lr=1.0), cfg, logprob_fn=_logprob_fn(lp, bf16),
                ghost_head=(lp.head, lp.decoder))  # fmt: skip
    metrics = step(batch)
    return before - torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


@pytest.mark.parametrize(("family", "pack", "bf16", "ckpt"), CASES)
def test_ghost_exact_opob_makes_the_per_trajectory_exact_update(
    family: str, pack: bool, bf16: bool, ckpt: bool
) -> None:
    batch = _batch(_model(family))
    want, wm = _update(family, batch, "backward", pack, bf16, ckpt)
    got, gm = _update(family, batch, "ghost", pack, bf16, ckpt)
    rtol = STEP_RTOL16 if bf16 else STEP_RTOL32
    assert float((got - want).norm() / want.norm()) <= rtol
    assert math.isclose(gm.traj_grad_norm_mean, wm.traj_grad_norm_mean, rel_tol=rtol)
    assert math.isclose(gm.baseline_mean, wm.baseline_mean, rel_tol=rtol)
    assert gm.clip_fraction == wm.clip_fraction > 0  # truncation at 1.5 was active in both


@pytest.mark.parametrize("hold", [False, True])
def test_a_group_split_over_micro_batches_gives_the_same_update(hold: bool) -> None:
    """Groups of 3 in micro-batches of 2: norms first (a forward per part), then the update (a forward again), or
    (hold) the parts' graphs held until the group's baseline is known."""
    batch = _batch(_model("qwen2"))
    want, _ = _update("qwen2", batch, "backward", True, False, False)
    got, _ = _update("qwen2", batch, "ghost", True, False, False, mbs=2, hold=hold)
    assert float((got - want).norm() / want.norm()) <= STEP_RTOL32


class _Scaled(nn.Module):
    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(d) + 0.1 * torch.randn(d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def test_a_layer_the_ghost_norms_do_not_cover_is_refused_by_name() -> None:
    model = nn.Sequential(nn.Linear(4, 4), _Scaled())
    with pytest.raises(GhostUnsupported, match=r"1 \(_Scaled\).*opob_norms: backward"):
        GhostNorms(model, list(model.parameters()))


@pytest.mark.parametrize("bf16", [False, True])
def test_tied_embeddings_take_the_cross_term_of_their_two_uses(bf16: bool) -> None:
    """Qwen2.5-0.5B ties its head to the embedding: one matrix, gradient E_i + H_i, ‖E_i + H_i‖² per trajectory."""
    model = _model("qwen2")
    model.lm_head.weight = model.model.embed_tokens.weight
    batch = _batch(model)
    lp = HFLogprobs(model, pack=True)
    params = list(model.parameters())
    ghost = GhostNorms(model, params, head=lp.head, head_input=lp.decoder)
    with ghost.capture(batch.input_ids, batch.loss_mask, batch.attention_mask.sum(-1).tolist()):
        logp = _logprob_fn(lp, bf16)(model, batch.input_ids, batch.attention_mask)
        f_i = (logp * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1)
        got = ghost.norms(f_i.sum(), retain_graph=True)
    want = torch.stack([
        sum(g.double().pow(2).sum() for g in torch.autograd.grad(f_i[i], params, retain_graph=True))
        for i in range(batch.size)
    ])  # fmt: skip
    torch.testing.assert_close(got, want, rtol=LAYER_RTOL16 if bf16 else LAYER_RTOL32, atol=0.0)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_pad_ids_embedding_row_gets_no_gradient_through_the_lookup(tied: bool) -> None:
    """nn.Embedding(padding_idx) (HF models built with a pad_token_id) gives the pad id's row no gradient through the
    lookup, whatever its output gradient: a trajectory that holds the pad id must not count that token."""
    model = _model("qwen2")
    model.model.embed_tokens.padding_idx = 5
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    batch = _batch(model)
    batch.input_ids[:, 4] = 5  # a loss token's input in every row (loss on tokens 3..)
    lp = HFLogprobs(model, pack=True)
    params = list(model.parameters())
    ghost = GhostNorms(model, params, head=lp.head, head_input=lp.decoder)
    with ghost.capture(batch.input_ids, batch.loss_mask, batch.attention_mask.sum(-1).tolist()):
        logp = lp.logprobs(model, batch.input_ids, batch.attention_mask)
        f_i = (logp * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1)
        got = ghost.norms(f_i.sum(), retain_graph=True)
    want = torch.stack([
        sum(g.double().pow(2).sum() for g in torch.autograd.grad(f_i[i], params, retain_graph=True))
        for i in range(batch.size)
    ])  # fmt: skip
    torch.testing.assert_close(got, want, rtol=LAYER_RTOL32, atol=0.0)


def test_weights_shared_by_other_layers_are_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    with pytest.raises(GhostUnsupported, match="shared weights"):
        GhostNorms(model, list(model.parameters()))


def test_a_model_the_ghost_norms_cannot_cover_falls_back_to_a_backward_per_trajectory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The config's default must not stop a model with other layers (a hybrid's linear attention): the step says
    why and runs exact OPOB the per-trajectory way, with the same update."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from vcpo_testlib import make_batch, tiny_model

    def with_extra(seed: int = 0) -> nn.Module:
        m = tiny_model(seed)
        torch.manual_seed(seed)
        m.extra = _Scaled(12).double()  # a parameter in a layer the ghost norms do not know; used below
        inner = m.mix.forward
        m.mix.forward = lambda h: inner(h) @ m.extra.weight  # type: ignore[method-assign]
        return m

    batch = make_batch(tiny_model())
    cfg = dict(ess_lr_rule="none", grad_clip=1e9, is_truncation=1.5)
    updates = []
    for norms in ("backward", "ghost"):
        m = with_extra()
        before = torch.cat([p.detach().flatten() for p in m.parameters()])
        with caplog.at_level("WARNING", logger="vcpo.step"):
            step = Step(m, torch.optim.SGD(m.parameters(), lr=1.0), StepConfig(opob_norms=norms, **cfg))
        assert step.ghost is None
        step(batch)
        updates.append(before - torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert "_Scaled" in caplog.text and "one backward per trajectory" in caplog.text
    assert torch.equal(updates[0], updates[1]) and updates[0].abs().max() > 0


def test_ghost_hooks_a_trainer_builds_that_refuse_its_model_fall_back_to_a_backward_per_trajectory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Step(ghost_norms=...) (the Megatron learner's TP-aware hooks): the factory's GhostUnsupported (context
    parallelism, MoE layers) is logged and exact OPOB runs the per-trajectory way."""
    model = _model("qwen2")

    def refuse() -> GhostNorms:
        raise GhostUnsupported("ghost norms (megatron): context parallelism is not covered")

    with caplog.at_level("WARNING", logger="vcpo.step"):
        step = Step(model, torch.optim.SGD(model.parameters(), lr=1.0), StepConfig(opob_norms="ghost"),
                    ghost_norms=refuse)  # fmt: skip
    assert step.ghost is None and "context parallelism" in caplog.text


def test_a_head_used_as_a_function_but_not_declared_is_refused() -> None:
    """The torch learner's log-probs call the head as a function: undeclared, its norm would be left out unseen."""
    model = _model("qwen2")
    batch = _batch(model)
    lp = HFLogprobs(model, pack=True)
    ghost = GhostNorms(model, list(model.parameters()))  # no head=
    with ghost.capture(batch.input_ids, batch.loss_mask, batch.attention_mask.sum(-1).tolist()):
        logp = lp.logprobs(model, batch.input_ids, batch.attention_mask)
        with pytest.raises(RuntimeError, match=r"\['lm_head'\] ran no forward through their module"):
            ghost.norms((logp * batch.loss_mask).sum(), retain_graph=False)
