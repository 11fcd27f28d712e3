"""The embedded engine's fused linears on oneDNN's prepacked weight (agent_rl/engines/embedded/fused.py): the
same product as MKL's `x @ W` up to the order of its fp32 sums, the copy following in-place weight writes, and
small matrices and single rows left on plain `x @ W`."""

from __future__ import annotations

import pytest
import torch
from float_bounds import drift
from torch import nn

from agent_rl.engines.embedded.fused import Fused

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"), reason="torch built without oneDNN linear"
)


def _layers(k: int, outs: list[int], bias: bool = False) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [nn.Linear(k, n, bias=bias) for n in outs]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_a_packed_product_is_the_plain_one_to_rounding(bias: bool, residual: bool) -> None:
    if bias and residual:
        pytest.skip("no supported architecture fuses a residual into a biased linear")
    k, outs = 576, [1536, 1536]  # SmolLM2's gate|up
    fused = Fused(_layers(k, outs, bias))
    assert fused.pack
    x, r = torch.randn(16, k), torch.randn(16, sum(outs))
    want = torch.addmm(r if residual else (fused.bias if bias else torch.zeros(sum(outs))), x, fused.weight)
    got = fused(x, r if residual else None)
    assert fused.packed is not None  # the prepacked path ran
    # one reduction of k terms, operands ~N(0,1) x U(±1/sqrt(k)): products sum to magnitude ~|x|_1/sqrt(k)
    scale = float(x.abs().sum(1).max()) / k**0.5
    assert (got - want).abs().max() <= drift(k, 1, scale)


def test_the_packed_copy_follows_an_in_place_weight_write() -> None:
    layers = _layers(576, [3072])
    fused = Fused(layers)
    x = torch.randn(8, 576)
    fused(x)
    with torch.no_grad():
        layers[0].weight.mul_(2.0)  # a weight push writes the HF parameter, a view of the fused matrix
    scale = 2 * float(x.abs().sum(1).max()) / 576**0.5
    assert (fused(x) - x @ fused.weight).abs().max() <= drift(576, 1, scale)


def test_small_matrices_and_single_rows_stay_on_plain_matmul() -> None:
    small = Fused(_layers(256, [256]))  # the toy model's o projection: 65k entries
    assert not small.pack
    big = Fused(_layers(576, [3072]))
    big(torch.randn(1, 576))
    assert big.packed is None  # one row (decode at batch 1): plain x @ W
    big(torch.randn(Fused.MIN_ROWS, 576))
    assert big.packed is not None
