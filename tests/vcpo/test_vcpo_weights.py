"""ESS, sequence log-weights and the ESS learning-rate rule."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from vcpo_testlib import run_gloo

from vcpo import effective_sample_size, ess_lr_scale, sequence_log_weights


def test_ess_of_equal_weights_is_batch_size() -> None:
    ess, ratio = effective_sample_size(torch.full((16,), -3.7))
    assert ess == pytest.approx(16.0) and ratio == pytest.approx(1.0)


def test_ess_tends_to_one_as_one_weight_dominates() -> None:
    values = []
    for big in (0.0, 2.0, 5.0, 20.0, 1e4):
        lw = torch.zeros(8, dtype=torch.float64)
        lw[3] = big
        values.append(effective_sample_size(lw)[0])
    assert values[0] == pytest.approx(8.0)
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == pytest.approx(1.0) and effective_sample_size(lw)[1] == pytest.approx(1 / 8)


def test_ess_is_invariant_to_scaling_all_weights() -> None:
    lw = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    base = effective_sample_size(lw)
    for shift in (-500.0, 7.0, 1e4):  # multiplying all weights by e^shift
        assert effective_sample_size(lw + shift) == pytest.approx(base, rel=1e-12)


def test_ess_matches_direct_formula_when_weights_are_moderate() -> None:
    lw = torch.randn(10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = lw.exp()
    assert effective_sample_size(lw)[0] == pytest.approx(float(w.sum() ** 2 / (w**2).sum()), rel=1e-12)


def test_ess_is_finite_at_log_ratios_of_1e4() -> None:
    lw = torch.tensor([1e4, -1e4, 0.0, 1e4 - 1.0, -1e4], dtype=torch.float64)
    ess, ratio = effective_sample_size(lw)
    e = math.exp(-1.0)
    assert math.isfinite(ess) and ess == pytest.approx((1 + e) ** 2 / (1 + e * e))
    # float32 input: these log-weights are exact in float32 (integers); the exp and the five-term sums after the
    # shift by the max round by a few eps32 = 1.2e-7 relative: rel 1e-6
    assert effective_sample_size(lw.float())[0] == pytest.approx(ess, rel=1e-6)  # float32 input too
    assert ratio == pytest.approx(ess / 5)


def test_ess_ignores_zero_weights_but_counts_them_in_the_ratio() -> None:
    ess, ratio = effective_sample_size(torch.tensor([0.0, 0.0, -math.inf, -math.inf]))
    assert ess == pytest.approx(2.0) and ratio == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [torch.tensor([]), torch.full((3,), -math.inf)])
def test_ess_of_empty_or_all_zero_weights_is_a_clear_error(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="no weights|all 3 weights are zero"):
        effective_sample_size(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_ess_refuses_nan_and_plus_inf_log_weights(bad: float) -> None:
    with pytest.raises(ValueError, match="log-weight 1 is"):
        effective_sample_size(torch.tensor([0.0, bad]))


def _ess_on_two_ranks(rank: int, world: int, lw: torch.Tensor, out: str) -> None:
    part = lw[:3] if rank == 0 else lw[3:]  # uneven split on purpose
    ess, ratio = effective_sample_size(part, dist.group.WORLD)
    if rank == 0:
        torch.save(torch.tensor([ess, ratio], dtype=torch.float64), out)


def test_ess_split_across_two_gloo_processes_equals_one_process(tmp_path) -> None:  # noqa: ANN001
    lw = torch.tensor([1e4, 3.0, -2.0, 1e4 - 0.5, 0.0, -1e4, 1e4 - 2.0], dtype=torch.float64)
    out = str(tmp_path / "ess.pt")
    run_gloo(_ess_on_two_ranks, 2, lw, out)
    ess, ratio = effective_sample_size(lw)
    got = torch.load(out)
    assert float(got[0]) == pytest.approx(ess, rel=1e-12) and float(got[1]) == pytest.approx(ratio, rel=1e-12)
    assert 1.0 < ess < 3.0  # three weights near e^1e4 dominate


def test_sequence_log_weights_ignore_masked_positions_and_sum_in_float64() -> None:
    lp = torch.tensor([[-math.inf, -1.0, -2.0, -5.0]])
    blp = torch.tensor([[0.0, -1.5, -1.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    s = sequence_log_weights(lp, blp, mask)
    assert s.dtype == torch.float64 and s.tolist() == [pytest.approx(-0.5)]


def test_sequence_log_weights_refuse_minus_inf_behaviour_on_a_loss_token() -> None:
    with pytest.raises(ValueError, match="trajectory 0"):
        sequence_log_weights(
            torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -math.inf]]), torch.tensor([[0, 1.0]])
        )


def test_ess_lr_scale_rules() -> None:
    assert ess_lr_scale(0.25) == pytest.approx(0.5)
    assert ess_lr_scale(0.25, rule="linear") == pytest.approx(0.25)
    assert ess_lr_scale(0.25, rule="none") == 1.0
    assert ess_lr_scale(0.6, base_ratio=0.55) == 1.0  # above ρ₀: undamped
    assert ess_lr_scale(0.275, base_ratio=0.55) == pytest.approx(math.sqrt(0.5))
    with pytest.raises(ValueError, match="ess_ratio"):
        ess_lr_scale(math.nan)
    with pytest.raises(ValueError, match="rule 'cube'"):
        ess_lr_scale(0.5, rule="cube")
