"""learner.dtype: bfloat16 on the Megatron learner, with every learner.gradient_checkpointing setting, at TP=1,
TP=2 with sequence parallelism and CP=2: bf16 parameters and compute, fp32 main weights and gradients
(mixed_precision.py).

Before it, every recompute setting crashed in backward ("expected m1 and m2 to have the same dtype": megatron's
recompute re-ran layers without the autocast context of the first forward).

Each setting takes one step on the same batch as an fp32 run of the same layout, in the same gloo processes.
What is compared, and how closely:
- the log-probs, per-trajectory gradient norms and the gradient the optimizer steps with agree with fp32 within
  the bf16 bounds below (the loss is not compared: it is a sum of terms with both signs, advantage-weighted, so
  its relative error has no bound of this kind);
- recompute changes no number: every recompute setting equals the bf16 run without it (it re-runs the same ops
  on the same inputs; fp32 roundoff allowed);
- the weights handed to the engines are the fp32 main weights, updated by AdamW from exactly that fp32
  gradient; the bf16 model holds those weights rounded to bf16.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import adamw_replay, build_tiny_dir, make_groups, recipe, requires_megatron, run_rank_steps

from agent_rl.batch import collate

pytestmark = requires_megatron

LAYERS = 2  # build_tiny_dir
U = 2.0**-8
"""bf16 unit roundoff (8 significant bits): each rounding to bf16 changes a value by at most this, relatively."""
ROUNDINGS = 5 * LAYERS + 3
"""bf16 roundings between the fp32 weights and one log-prob: in each layer the inputs of its four GEMMs (qkv, proj,
fc1, fc2) and the residual stream; then the embedding output, the final norm and the output GEMM's input."""
LOGPROB_ATOL = ROUNDINGS * U
"""|log p_bf16 − log p_fp32| <= ROUNDINGS · U · (1 + |log p|): first order in U, each rounding a relative error
of the logits (|log p| <= max |z| + log V scales the absolute error)."""
GRAD_RTOL = 2 * ROUNDINGS * U
"""‖g_bf16 − g_fp32‖ <= 2 · ROUNDINGS · U · ‖g_fp32‖ per tensor, and the same for gradient norms: backward passes
through as many roundings again (activation gradients are bf16 too)."""
RECOMPUTE_RTOL = 1e-6
"""bf16 with recompute vs without: the same ops on the same inputs; only fp32 accumulation order may differ."""
ADAM_ATOL_PER_LR = 1e-5
"""AdamW replayed on the captured gradient: the same fp32 element-wise ops; a few fp32 ulps of the update (<= lr)."""
ADAM_WEIGHT_RTOL = 2 * 2.0**-24
"""The new weight is rounded to float32 once more: the learner's AdamW kernel (CUDA's foreach / fused ones, or
another CPU vector width) and the replay may land on neighbouring floats: one unit of float32 rounding (2^-24
relative) on each side (seen on an H200: model.norm.weight 1.19e-7 apart at |w| = 1, lr 2.7e-3)."""

SETTINGS = {
    "off": {},
    "full-uniform": {"gradient_checkpointing": True},
    "full-block": {"gradient_checkpointing": "full", "recompute_method": "block"},
    "selective-attn": {"gradient_checkpointing": "selective"},
    "selective-attn-mlp": {"gradient_checkpointing": "selective", "recompute_modules": ["core_attn", "mlp"]},
}
LAYOUTS = {"tp1": {}, "tp2-sp": {"tp": 2, "sp": True}, "cp2": {"cp": 2}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_dir(tmp_path_factory.mktemp("bf16_tiny"))


@pytest.fixture(scope="module")
def batch(model_dir):
    return collate(make_groups(model_dir, seed=0)).policy


PPO = {"loss": "ppo_clip", "advantage": "grpo"}
"""A token-level loss in micro-batches of 2 trajectories: gradients accumulate over 3 backward passes per step."""


def _spec(model_dir, layout, algorithm=None, **learner):
    from agent_rl.learners.megatron import megatron_spec

    return megatron_spec(
        recipe(model_dir, algorithm, backend="megatron", **LAYOUTS[layout], **learner).learner_spec
    )


@pytest.fixture(scope="module", params=list(LAYOUTS))
def runs(request, model_dir, batch, tmp_path_factory):
    """{"fp32": record, "bf16-<setting>": record} for one layout, from one set of gloo processes."""
    specs = {"fp32": _spec(model_dir, request.param)}
    for name, learner in SETTINGS.items():
        specs[f"bf16-{name}"] = _spec(model_dir, request.param, dtype="bfloat16", **learner)
    specs["fp32-ppo"] = _spec(model_dir, request.param, PPO, micro_batch_size=2)
    specs["bf16-ppo"] = _spec(model_dir, request.param, PPO, micro_batch_size=2, dtype="bfloat16")
    assert specs["bf16-full-uniform"].recompute.granularity == "full"
    return specs, run_rank_steps(specs, [batch], tmp_path_factory.mktemp("bf16_runs"))


@pytest.mark.parametrize("setting", [*SETTINGS, "ppo"])
def test_bf16_step_agrees_with_fp32(runs, batch, setting):
    """Every recompute setting (VCPO: one backward per trajectory), and a loss whose gradients accumulate over
    micro-batches (ppo: the fp32 main gradient must sum them)."""
    _, got = runs
    ref, run = (
        (got["fp32-ppo"], got["bf16-ppo"]) if setting == "ppo" else (got["fp32"], got[f"bf16-{setting}"])
    )
    real = batch.attention_mask.bool().clone()
    real[:, 0] = False
    lp, lp_ref = run["logprobs"][real], ref["logprobs"][real]
    assert float((lp - lp_ref).abs().max()) > 0  # it really ran in bf16
    assert torch.all((lp - lp_ref).abs() <= LOGPROB_ATOL * (1 + lp_ref.abs()))
    for key in ("grad_norm", "traj_grad_norm_mean", "traj_grad_norm_max"):
        if setting == "ppo" and key != "grad_norm":
            continue  # per-trajectory norms are exact OPOB's
        assert run["metrics"][key] == pytest.approx(ref["metrics"][key], rel=GRAD_RTOL), key
    for name, g in ref["grads"].items():
        assert run["grads"][name].dtype == torch.float32, name
        if g.norm() > 0:
            err = float((run["grads"][name] - g).norm() / g.norm())
            assert err <= GRAD_RTOL, f"{name}: relative gradient error {err:.3g}"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s != "off"])
def test_recompute_changes_nothing_in_bf16(runs, setting):
    _, got = runs
    base, run = got["bf16-off"], got[f"bf16-{setting}"]
    torch.testing.assert_close(run["logprobs"], base["logprobs"], rtol=RECOMPUTE_RTOL, atol=0)
    for name, g in base["grads"].items():
        torch.testing.assert_close(run["grads"][name], g, rtol=RECOMPUTE_RTOL, atol=1e-12, msg=name)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_bf16_weights_are_the_fp32_main_weights_updated_by_adamw(runs, model_dir, setting):
    from transformers import AutoModelForCausalLM

    specs, got = runs
    spec, run = specs[f"bf16-{setting}"], got[f"bf16-{setting}"]
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    lr = run["metrics"]["lr"]
    want = adamw_replay(initial, run["grads"], spec, lr)
    assert set(run["weights"]) == set(initial)
    rounded_away = 0
    for name, w in run["weights"].items():
        assert w.dtype == torch.float32, name  # model.dtype float32: the engines get full precision
        torch.testing.assert_close(w, want[name], rtol=ADAM_WEIGHT_RTOL, atol=ADAM_ATOL_PER_LR * lr, msg=name)
        assert torch.equal(run["model"][name], w.to(torch.bfloat16)), (
            f"{name}: bf16 model != rounded main weights"
        )
        rounded_away += int((w.to(torch.bfloat16).float() != w).sum())
    assert rounded_away > 0  # the main weights keep what bf16 rounds away
