"""logprobs_of and the logit-gradient proxy on a real (tiny, random) Hugging Face Qwen2 model."""

from __future__ import annotations

import math

import pytest
import torch

from vcpo import PolicyBatch, Step, StepConfig, logit_grad_proxy_of, logprobs_of


@pytest.fixture(scope="module")
def qwen() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False, use_cache=False)  # fmt: skip
    return Qwen2ForCausalLM(cfg).double()


def test_logprobs_of_matches_log_softmax_and_ignores_right_padding(qwen: torch.nn.Module) -> None:
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 6:] = 0
    lp = logprobs_of(qwen, ids, am)
    logits = qwen(ids[:1]).logits[0]
    expected = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    # float64 (F64 in vcpo_testlib.py: ~1e-13 relative apart at most), log-probs of magnitude ~4
    assert lp[0, 0] == 0 and torch.allclose(lp[0, 1:], expected, atol=1e-10)
    alone = logprobs_of(qwen, ids[1:, :6], am[1:, :6])
    assert torch.allclose(lp[1, :6], alone[0], atol=1e-10)


def test_logit_grad_proxy_equals_autograd_norm_with_respect_to_logits(qwen: torch.nn.Module) -> None:
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    lp, gsq = logit_grad_proxy_of(qwen, ids, torch.ones_like(ids))
    assert torch.allclose(lp, logprobs_of(qwen, ids, torch.ones_like(ids)), atol=1e-12)
    logits = qwen(ids).logits.detach().requires_grad_(True)
    for t in range(1, 8):
        (g,) = torch.autograd.grad(torch.log_softmax(logits[0, t - 1], -1)[ids[0, t]], logits)
        assert float(gsq[0, t]) == pytest.approx(float((g**2).sum()), rel=1e-10)


def test_vcpo_step_on_qwen2_changes_the_model_and_reports_finite_metrics(qwen: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(2)
    b, t = 8, 14
    ids = torch.randint(0, 64, (b, t), generator=g)
    am = torch.ones_like(ids)
    am[::2, 10:] = 0
    lm = am.double()
    lm[:, :4] = 0
    with torch.no_grad():
        blp = torch.where(lm > 0, logprobs_of(qwen, ids, am) - 0.1 * torch.rand(b, t, generator=g), 0.0)
    batch = PolicyBatch(ids, am, lm, blp, torch.rand(b, generator=g), torch.arange(2).repeat_interleave(4))
    before = [p.detach().clone() for p in qwen.parameters()]
    for mode in ("exact", "proxy"):
        metrics = Step(qwen, torch.optim.AdamW(qwen.parameters(), lr=1e-3), StepConfig(opob_mode=mode))(batch)
        assert all(math.isfinite(v) for v in metrics.as_dict().values())
        assert metrics.tokens == float(lm.sum()) and metrics.trajectories == 8
    assert any(not torch.equal(a, p) for a, p in zip(before, qwen.parameters(), strict=True))
