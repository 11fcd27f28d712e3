"""The torch learner on Qwen3 (q/k RMSNorm; HF transformers' own Qwen3ForCausalLM): a tiny random Qwen3
trains one step, full or LoRA, and its exported hf/ reloads with the trained weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from learner_helpers import CPU, make_groups, recipe_for

from agent_rl import checkpoint
from agent_rl.learners import build
from benchmarks.mismatch import random_model


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8.0}])
def test_tiny_qwen3_trains_one_step_and_its_export_reloads(
    tiny_model_dir: Path, tmp_path: Path, lora
) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = random_model("qwen3", tmp_path / "qwen3", tiny_model_dir)
    # CPU: the export is compared with the learner's own logits after a reload on the CPU
    learner = build(recipe_for(model_dir, learner={"lora": lora, **CPU}).learner_spec)
    assert (
        type(learner.local.model.get_base_model() if lora else learner.local.model).__name__
        == "Qwen3ForCausalLM"
    )
    before = {k: v.clone() for k, v in learner.hf_state_dict().items()}
    assert any(".q_norm." in k for k in before) and any(".k_norm." in k for k in before)
    m = learner.step(make_groups(model_dir, n_groups=2, n=2))
    assert all(math.isfinite(v) for v in m.values()) and learner.version == 1
    after = learner.hf_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    ckpt = checkpoint.save(
        tmp_path / "run", learner, checkpoint.LoopState(1, {}, {}), model_dir=model_dir, keep=1
    )
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():
        reloaded = AutoModelForCausalLM.from_pretrained(ckpt / "hf", dtype=torch.float32)(ids).logits
        want = learner.local.model(ids).logits
    assert type(AutoModelForCausalLM.from_pretrained(ckpt / "hf")).__name__ == "Qwen3ForCausalLM"
    assert torch.allclose(reloaded, want, atol=1e-5)
