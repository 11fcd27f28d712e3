"""Qwen3 in the Megatron learner (our converter extended with q/k norms; mbridge is not used on CPU, see the
README): the HF<->Megatron round trip is exact, and at TP=1, TP=2 and TP=2+SP one step equals the torch
learner's (the per-head q/k norm gradients summed over TP)."""

from __future__ import annotations

import pytest
import torch
from _helpers import make_groups, recipe, requires_megatron

from agent_rl.learners.megatron.convert import hf_to_megatron, megatron_to_hf
from agent_rl.learners.megatron.shape import shape_from_hf_config
from benchmarks.mismatch import random_model

pytestmark = requires_megatron


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    root = tmp_path_factory.mktemp("qwen3")
    tok = build_tiny(root / "tok", sample_corpus(), vocab_size=320, hidden=32, layers=1, heads=2, kv_heads=2)
    return random_model("qwen3", root / "model", tok)


@pytest.mark.parametrize("te", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_qwen3_round_trip_is_exact(qwen3_dir, tp, te):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir).state_dict()
    shape = shape_from_hf_config(AutoModelForCausalLM.from_pretrained(qwen3_dir).config)
    assert shape.qk_norm and not shape.qkv_bias
    back = megatron_to_hf(
        [hf_to_megatron(hf, shape, tp_rank=r, tp_size=tp, te=te) for r in range(tp)], shape, te=te
    )
    assert set(back) == set(hf) and all(torch.equal(back[k], v) for k, v in hf.items())


@pytest.mark.parametrize("layout", [{}, {"tp": 2}, {"tp": 2, "sp": True}], ids=["tp1", "tp2", "tp2-sp"])
def test_qwen3_megatron_step_equals_torch_learner(qwen3_dir, layout):
    from agent_rl.learners import build

    groups = make_groups(qwen3_dir, 0)
    ref_learner = build(recipe(qwen3_dir).learner_spec)
    ref = dict(ref_learner.step(groups))
    ref_w = ref_learner.hf_state_dict()
    learner = build(recipe(qwen3_dir, backend="megatron", **layout).learner_spec, pool="processes")
    try:
        got = dict(learner.step(groups))
        got_w = learner.hf_state_dict()
    finally:
        learner.close()
    for key in ("learner/loss", "learner/grad_norm", "vcpo/traj_grad_norm_mean", "vcpo/baseline_mean"):
        assert got[key] == pytest.approx(ref[key], rel=2e-4, abs=1e-6), key
    for k in ("model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"):
        torch.testing.assert_close(got_w[k], ref_w[k], rtol=0, atol=1e-4)  # the norm updates agree across TP
