"""fp32 LM head (model.lm_head_fp32): the learner's head outside bf16 autocast, the engine's norm and head in fp32.

References are computed here from the same hidden states with plain fp32 ops. Bounds: the fp32 path against
the fp32 reference differs only by the order of fp32 sums (chunked GEMM vs one GEMM; 64-wide dot products of
O(1) terms: well under 1e-5 in a log-prob); the bf16 path rounds the head's output (or its operands) to 8
mantissa bits, 2^-9 relative, which on logits of magnitude ~1-10 moves log-probs by >= 1e-3 somewhere among
hundreds of tokens (asserted, so each test can fail).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

FP32_BOUND = 1e-5
BF16_SEPARATION = 1e-3
VOCAB, HIDDEN = 512, 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # a sharper head: logits of a few units, as a trained model's
        model.model.norm.weight.uniform_(0.5, 1.5)
    out = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(out)
    return out


def _ids(n_rows: int = 4, length: int = 48) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n_rows, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_learner_head_in_fp32_under_bf16_autocast(model_dir, pack):
    from transformers import AutoModelForCausalLM

    from agent_rl.learners.hf_logprobs import HFLogprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = _ids()
    am = torch.ones_like(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        assert hidden.dtype == torch.float32  # the final norm's output is fp32 already (fp32 master weights)
        on = HFLogprobs(model, pack=pack, head_fp32=True).logprobs(model, ids, am)
        off = HFLogprobs(model, pack=pack, head_fp32=False).logprobs(model, ids, am)
    with torch.no_grad():
        logits = hidden.detach().double() @ model.lm_head.weight.detach().double().t()
        want = torch.zeros_like(on, dtype=torch.float64)
        want[:, 1:] = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    assert (on.double() - want).abs().max() <= FP32_BOUND
    assert (off.double() - want).abs().max() > BF16_SEPARATION  # what the setting changes
    on[:, 1:].sum().backward()  # the head's gradient reaches the fp32 master weight
    assert model.lm_head.weight.grad is not None and bool(model.lm_head.weight.grad.abs().sum() > 0)


def test_engine_norm_and_head_in_fp32_for_a_bf16_model(model_dir):
    from agent_rl.engines.embedded.loader import load_model

    model = load_model(model_dir, dtype="bfloat16", max_seq_len=64)
    x = torch.randn(32, HIDDEN, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 4

    def reference() -> torch.Tensor:
        h = F.rms_norm(x.double(), (HIDDEN,), eps=model.model.norm.eps) * model.model.norm.weight.double()
        return h @ model.lm_head.weight.double().t()

    model.head_fp32 = False
    off = model.logits(x)
    model.head_fp32 = True
    on = model.logits(x)
    assert (on.double() - reference()).abs().max() <= FP32_BOUND * on.abs().max()
    assert (off.double() - reference()).abs().max() > BF16_SEPARATION
    with torch.no_grad():  # a weight update writes in place: the fp32 copies must follow it
        model.lm_head.weight.mul_(0.5)
        model.model.norm.weight.add_(0.25)
    again = model.logits(x)
    assert (again.double() - reference()).abs().max() <= FP32_BOUND * again.abs().max()


def test_the_model_setting_reaches_the_learner_and_the_engines(model_dir):
    from agent_rl.config import Recipe
    from agent_rl.engines.embedded.server import parse_args
    from agent_rl.learners.torch_learner import rank_spec

    recipe = Recipe.model_validate(
        {
            "name": "h", "model": {"path": str(model_dir), "dtype": "bfloat16", "lm_head_fp32": True},
            "envs": {"train": "tiny_arith.yaml"}, "train": {"steps": 1, "batch_prompts": 1},
            "learner": {"dtype": "bfloat16"},
        }
    )  # fmt: skip
    assert rank_spec(recipe.learner_spec).lm_head_fp32 is True
    assert recipe.engines.options(recipe.model.dtype, recipe.model.lm_head_fp32).lm_head_fp32 is True
    assert parse_args([str(model_dir), "--lm-head-fp32", "--insecure"]).lm_head_fp32 is True  # agent-rl serve
    from agent_rl.engines.embedded.scheduler import Scheduler

    opts = recipe.engines.options(recipe.model.dtype, recipe.model.lm_head_fp32)
    assert Scheduler(model_dir, opts).model.head_fp32 is True  # what the embedded engine computes with
