"""Exact OPOB from ghost norms on the Megatron learner at TP=2 with sequence parallelism
(agent_rl/learners/megatron/ghost.py): each layer's ‖∇ f_i‖², reduced over the TP ranks, equals the one the
trajectory's own gradient gives, and the step (opob_norms: ghost) makes the update of the per-trajectory exact
OPOB and of the torch learner. Ranks are gloo processes on the CPU, as in test_equivalence.py.

Float bounds (tests/float_bounds.py's reasoning):

- LAYER_RTOL, one layer's whole-model share from the same forward graph, fp32. The reference's weight gradient
  sums T per-token products per entry, the ghost form d-term Gram entries then T² of them, the head rule forms
  its logits again with a GEMM of another shape (one more chained reduction): n ≤ T·D = 32·160 terms (T: the
  longest trajectory with its SP padding, D: the widest layer on a rank, the vocabulary shard 320 / 2), three
  chained reductions, and squaring doubles a relative error: 2·drift(32·160, 3, 1) = 1.0e-4 of the layer's share
  (a sum of squares: no cancellation). A layer left out is 100 % of its share; a share not reduced over TP is
  ~50 % off.
- STEP_RTOL, the ghost step against a backward per trajectory (Megatron's own, or the torch learner's on the HF
  model): the two run the forward in other layouts (one packed micro-batch vs one trajectory at a time) and the
  backward in other groupings through 2 · 17 chained reductions of ≤ 512 terms: 2·drift(512, 34, 1) = 3.7e-4 of
  the update's norm and of each metric (tests/vcpo/test_ghost_norms.py's STEP_RTOL32, same reasoning).
- BF16_RTOL, the same comparison with learner.dtype bfloat16 on both sides (bf16 parameters and compute, fp32 main
  gradients): the two layouts round other values to bf16 at each of test_bf16.py's ROUNDINGS = 5·2 + 3 places
  forward and as many backward, each by at most u = 2^-8 relative: 2·ROUNDINGS·u = 0.10, test_bf16.py's GRAD_RTOL
  (a TP share left unreduced moves ‖g_i‖ by ~30 %). The loss is not compared there (test_bf16.py says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _ghost_workers import ghost_layers_worker, ghost_step_worker
from _helpers import build_tiny_dir, make_groups, recipe, reference_step, requires_megatron, spawn_ranks
from float_bounds import drift

from agent_rl.batch import collate

pytestmark = requires_megatron

LAYER_RTOL = 2 * drift(32 * 160, 3, 1.0)
STEP_RTOL = 2 * drift(512, 34, 1.0)
BF16_RTOL = 2 * (5 * 2 + 3) * 2.0**-8
PAD_ID = 0  # build_tiny's tokenizer: <|endoftext|>, the models' pad_token_id (model.freeze_padding_row)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_dir(tmp_path_factory.mktemp("ghost_tiny"))


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    out = tmp_path_factory.mktemp("ghost_tied")
    return build_tiny(out, sample_corpus(), vocab_size=320, hidden=64, layers=2, heads=4, kv_heads=2,
                      intermediate=128, tie_embeddings=True)  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """test_megatron_qwen3.py's Qwen3 (q/k norms: each TP rank normalises its own heads, a partial sum over TP)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from agent_rl.tools.tiny import build_tiny, sample_corpus
    from benchmarks.mismatch import random_model

    root = tmp_path_factory.mktemp("ghost_qwen3")
    tok = build_tiny(root / "tok", sample_corpus(), vocab_size=320, hidden=32, layers=1, heads=2, kv_heads=2)
    return random_model("qwen3", root / "model", tok)


@pytest.fixture(scope="module")
def batch(model_dir):
    """Two groups of three (13-28 tokens each), one loss token's input made the pad id: the lookup gives that row
    no gradient (freeze_padding_row), which the embedding's norm must follow."""
    b = collate(make_groups(model_dir, seed=0)).policy
    b.input_ids[1, 12] = PAD_ID
    assert b.loss_mask[1, 13] > 0
    return b


@pytest.fixture(scope="module")
def layers(model_dir, tied_dir, qwen3_dir, batch, tmp_path_factory, monkeypatch_module):
    from agent_rl.learners._pool import free_port
    from agent_rl.learners.megatron.model import ParallelConfig

    monkeypatch_module.setenv(
        "CUDA_VISIBLE_DEVICES", ""
    )  # CPU shards over gloo (test_equivalence.py says why)
    out = tmp_path_factory.mktemp("ghost_layers") / "layers.pt"
    cases = {
        "packed": (str(model_dir), True),
        "padded": (str(model_dir), False),
        "tied": (str(tied_dir), True),
        "qwen3": (str(qwen3_dir), True),
    }
    par = ParallelConfig(tp=2, sp=True)
    spawn_ranks(ghost_layers_worker, (2, free_port(), par, cases, batch, str(out)), 2)
    return torch.load(out)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.parametrize("case", ["packed", "padded", "tied", "qwen3"])
def test_each_layers_ghost_norm_at_tp2_sp_equals_the_trajectorys_own_gradient(layers, case):
    """Every layer's share (column- and row-parallel linears, the vocab-parallel embedding and head, the SP norms),
    reduced over the two TP ranks, against the trajectory's own finished gradient from the same forward graph;
    packed and right-padded micro-batches, an output head tied to the embedding (the cross term), and Qwen3's q/k
    norms (each rank's heads: summed over TP before squaring)."""
    rec = layers[case]
    got, want = rec["ghost"], rec["want"]
    assert set(got) == set(want), f"layers missing from the ghost norms: {set(want) - set(got)}"
    if case == "qwen3":
        qk = {"decoder.layers.0.self_attention.q_layernorm", "decoder.layers.0.self_attention.k_layernorm"}
        assert qk < set(want)
    else:  # 2 x (2 norms, qkv, proj, fc1, fc2), the final norm, the embedding, the head (tied: the embedding's)
        assert len(want) == (15 if case != "tied" else 14)
    for name, w in want.items():
        assert float(w.min()) > 0, name  # every layer has a gradient in every trajectory: a dropped one shows
        torch.testing.assert_close(got[name], w, rtol=LAYER_RTOL, atol=0.0, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(rec["total"], sum(want.values()), rtol=LAYER_RTOL, atol=0.0)


@pytest.fixture(scope="module")
def steps(model_dir, batch, tmp_path_factory, monkeypatch_module):
    from agent_rl.learners._pool import free_port
    from agent_rl.learners.megatron import megatron_spec

    monkeypatch_module.setenv("CUDA_VISIBLE_DEVICES", "")
    tp2 = {"backend": "megatron", "tp": 2, "sp": True}
    ghost = {"opob_norms": "ghost"}
    specs = {
        name: megatron_spec(recipe(model_dir, algorithm, **tp2, **learner).learner_spec)
        for name, (algorithm, learner) in {
            "backward": ({}, {}),
            "ghost": (ghost, {}),
            "ghost-padded": (ghost, {"pack_sequences": False}),
            "ghost-recompute": (ghost, {"gradient_checkpointing": True}),  # megatron's reentrant recompute
            "backward-bf16": ({}, {"dtype": "bfloat16"}),
            # the norm pass's backward puts back the fp32 main gradients too (mixed_precision.MainParams)
            "ghost-bf16-recompute": (ghost, {"dtype": "bfloat16", "gradient_checkpointing": True}),
        }.items()
    }
    out = tmp_path_factory.mktemp("ghost_steps") / "steps.pt"
    spawn_ranks(ghost_step_worker, (2, free_port(), specs, batch, str(out)), 2)
    return torch.load(out, weights_only=False), reference_step(model_dir, specs["backward"], batch)


COMPARED = [
    "loss",
    "grad_norm",
    "traj_grad_norm_mean",
    "traj_grad_norm_max",
    "baseline_mean",
    "ess",
    "advantage_std",
]


@pytest.mark.parametrize("name", ["ghost", "ghost-padded", "ghost-recompute"])
def test_ghost_exact_opob_step_at_tp2_sp_makes_the_per_trajectory_update(steps, name):
    """The step with ghost norms against Megatron's backward per trajectory and the torch learner's (vcpo.Step on
    the HF model): the same metrics and the same gradient (the update before AdamW), in HF names."""
    got, torch_learner = steps
    rec = got[name]
    assert got["backward"]["ghost"] is None and rec["ghost"] == "MegatronGhostNorms"  # the ghost path ran
    flat = lambda grads: torch.cat([grads[k].flatten() for k in sorted(grads)])  # noqa: E731
    for ref_name, ref in (("megatron backward", got["backward"]), ("torch learner", torch_learner)):
        for key in COMPARED:
            assert rec["metrics"][key] == pytest.approx(ref["metrics"][key], rel=STEP_RTOL), (
                f"{ref_name}: {key}"
            )
        want = flat(ref["grads"])
        err = float((flat(rec["grads"]) - want).norm() / want.norm())
        assert err <= STEP_RTOL, f"{ref_name}: relative gradient error {err:.3g}"


def test_context_parallelism_is_refused_so_the_step_backs_up_each_trajectory():
    """Under CP a trajectory's tokens lie on several ranks (cross-rank token pairs): refused before any hook, and
    vcpo.Step turns GhostUnsupported into a backward per trajectory (tests/vcpo/test_ghost_norms.py)."""
    from agent_rl.learners.megatron.ghost import MegatronGhostNorms
    from agent_rl.learners.megatron.grads import ShardGroups
    from agent_rl.learners.megatron.model import ParallelConfig
    from vcpo.ghost import GhostUnsupported

    with pytest.raises(GhostUnsupported, match=r"context parallelism.*opob_norms: backward"):
        MegatronGhostNorms(torch.nn.Linear(2, 2), par=ParallelConfig(cp=2), groups=ShardGroups(None, None, None),
                           pack=True)  # fmt: skip


def test_ghost_exact_opob_step_in_bf16_makes_the_per_trajectory_update(steps):
    """learner.dtype bfloat16 with full recompute: the ghost step against the bf16 backward per trajectory."""
    got, _ = steps
    rec, ref = got["ghost-bf16-recompute"], got["backward-bf16"]
    assert ref["ghost"] is None and rec["ghost"] == "MegatronGhostNorms"
    for key in COMPARED[1:]:  # not the loss
        assert rec["metrics"][key] == pytest.approx(ref["metrics"][key], rel=BF16_RTOL), key
    flat = lambda grads: torch.cat([grads[k].flatten() for k in sorted(grads)])  # noqa: E731
    want = flat(ref["grads"])
    err = float((flat(rec["grads"]) - want).norm() / want.norm())
    assert err <= BF16_RTOL, f"relative gradient error {err:.3g}"
