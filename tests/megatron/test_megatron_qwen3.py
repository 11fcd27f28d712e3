"""Qwen3 in the Megatron learner (our converter extended with q/k norms; mbridge is not used on CPU, see the
README): the HF<->Megatron round trip is exact, and at TP=1, TP=2 and TP=2+SP one step has the metrics and the
gradient of vcpo.Step on the HF model (the per-head q/k norm gradients summed over TP). Gradients, not weights after
Adam, are compared: see test_equivalence.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# benchmarks/mismatch.py imports its neighbours as a script does (bench_paths): this file alone must collect too.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _helpers import make_groups, recipe, reference_step, requires_megatron, run_rank_steps

from agent_rl.learners.megatron.convert import hf_to_megatron, megatron_to_hf
from agent_rl.learners.megatron.shape import shape_from_hf_config
from benchmarks.mismatch import random_model

pytestmark = requires_megatron

GRAD_RTOL = 120 * 2.0**-23
"""fp32 per-tensor bound, as test_equivalence.GRAD_RTOL: a weight gradient sums <= 120 per-token terms."""


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
def test_qwen3_megatron_step_equals_vcpo_on_the_hf_model(qwen3_dir, layout, tmp_path):
    from agent_rl.batch import collate
    from agent_rl.learners.megatron import megatron_spec

    batch = collate(make_groups(qwen3_dir, 0)).policy
    spec = megatron_spec(recipe(qwen3_dir, backend="megatron", **layout).learner_spec)
    got = run_rank_steps({"megatron": spec}, [batch], tmp_path)["megatron"]
    ref = reference_step(qwen3_dir, spec, batch)
    for key in ("loss", "grad_norm", "traj_grad_norm_mean", "baseline_mean"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=2e-4, abs=1e-6), key
    assert "model.layers.0.self_attn.q_norm.weight" in ref["grads"]
    for name, g in ref["grads"].items():  # the q/k norm gradients included: summed over the TP ranks' heads
        err = float((got["grads"][name] - g).norm()) / max(float(g.norm()), 1e-30)
        assert err <= GRAD_RTOL or float(g.norm()) == 0.0, f"{name}: relative gradient error {err:.3g}"
