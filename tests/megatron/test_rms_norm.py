"""rms_norm.rms_norm (the local spec's norm): torch's RMSNorm values and gradients, keeping only the input and a
per-token fp32 scale for backward."""

from __future__ import annotations

import torch

from agent_rl.learners.megatron.rms_norm import rms_norm


def test_rms_norm_gradients_are_exact_in_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-6), (x, w))


def test_rms_norm_equals_torch_rms_norm_in_fp32():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 64, generator=g, requires_grad=True)
    w = torch.randn(64, generator=g, requires_grad=True)
    up = torch.randn(7, 64, generator=g)
    got, want = rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (64,), w, 1e-6)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    grads, want_grads = (torch.autograd.grad((y * up).sum(), (x, w)) for y in (got, want))
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # 64-term reductions in another order


def test_rms_norm_keeps_the_bf16_input_and_a_scale_per_token():
    x = torch.randn(100, 896, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(896, dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = rms_norm(x, w, 1e-6)
    assert y.dtype == torch.bfloat16
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [((100, 896), torch.bfloat16), ((896,), torch.bfloat16), ((100, 1), torch.float32)]
    )
