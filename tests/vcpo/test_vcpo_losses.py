"""Every registered loss: finite gradients on random inputs; vanilla REINFORCE when μ = π."""

from __future__ import annotations

import math

import pytest
import torch

from vcpo import LOSSES, LossInputs, get_loss
from vcpo.losses import loss_kwargs, m2po_threshold

NAMES = list(LOSSES)


def test_registry_holds_exactly_the_comparison_set() -> None:
    assert set(NAMES) == {"reinforce", "tis_token", "tis_seq", "mis", "icepop", "m2po", "ppo_clip", "gspo",
                          "cispo", "vcpo"}  # fmt: skip


def _inputs(seed: int, *, same_policy: bool, scale: float = 1.0) -> tuple[LossInputs, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    mask = (torch.rand(b, t, generator=g) < 0.8).double()
    mask[:, 0] = 0.0
    mask[5] = 0.0  # a trajectory without loss tokens must contribute exactly nothing
    raw = torch.randn(b, t, generator=g, dtype=torch.float64, requires_grad=True)
    lp = torch.nn.functional.logsigmoid(raw)  # valid log-probs, differentiable through raw
    if same_policy:
        blp = lp.detach().clone()
    else:
        blp = torch.nn.functional.logsigmoid(torch.randn(b, t, generator=g, dtype=torch.float64) * scale)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    return LossInputs(lp, blp, mask, adv, is_truncation=2.0, extra={"m2_threshold": 0.5}), raw


def _grad(name: str, inp: LossInputs, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    spec = get_loss(name)
    out = spec.fn(inp, **loss_kwargs(spec, {}))
    (g,) = torch.autograd.grad(out.loss.sum(), raw, retain_graph=True)
    return g, out.loss


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_every_loss_has_finite_gradients_on_random_inputs(name: str, scale: float) -> None:
    inp, raw = _inputs(0, same_policy=False, scale=scale)  # scale 30: log-ratios in the tens
    g, loss = _grad(name, inp, raw)
    assert torch.isfinite(g).all() and torch.isfinite(loss).all()
    assert loss[5] == 0 and (g[5] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_every_loss_is_vanilla_reinforce_when_behaviour_equals_current(name: str) -> None:
    inp, raw = _inputs(1, same_policy=True)
    g, _ = _grad(name, inp, raw)
    mean_lp = (inp.logprobs * inp.loss_mask).sum(-1) / inp.loss_mask.sum(-1).clamp(min=1)
    (expected,) = torch.autograd.grad(-(inp.advantages * mean_lp).sum(), raw)
    # float64, one reduction of <= 9 terms each way: <= 9·u ≈ 1e-15 relative apart (tests/vcpo/vcpo_testlib.py)
    assert torch.allclose(g, expected, rtol=1e-12, atol=1e-15)
    assert float(g.abs().sum()) > 0


def test_sequence_weighted_losses_truncate_or_reject_by_the_sequence_weight() -> None:
    inp, raw = _inputs(2, same_policy=False)
    s = ((inp.logprobs.detach() - inp.behavior_logprobs) * inp.loss_mask).sum(-1)
    g_reinf, _ = _grad("reinforce", inp, raw)
    for name, weight in (
        ("tis_seq", s.exp().clamp(max=2.0)),
        ("mis", torch.where(s <= math.log(2.0), s.exp(), 0.0)),
    ):
        g, _ = _grad(name, inp, raw)
        assert torch.allclose(g, g_reinf * weight[:, None], rtol=1e-12, atol=1e-15), name


def test_m2po_threshold_masks_largest_squared_log_ratios_until_second_moment_fits() -> None:
    x = torch.tensor([0.01, 0.02, 0.03, 1.0, 4.0], dtype=torch.float64)
    # keep 3: mean .02 <= .04; keep 4: mean .265 > .04
    assert m2po_threshold(x, tau=0.04) == {"m2_threshold": pytest.approx(0.03)}
    assert m2po_threshold(x[:3], tau=0.04) == {"m2_threshold": math.inf}
    assert m2po_threshold(torch.tensor([1.0, 2.0]), tau=0.04) == {"m2_threshold": -1.0}
