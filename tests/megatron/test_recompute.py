"""learner.gradient_checkpointing reaches megatron-core's activation recompute: full (uniform, block) and
selective recompute keep fewer activations for the backward pass and give the same gradients.

Measured as the bytes autograd saves during the forward pass (torch.autograd.graph.saved_tensors_hooks), which
is the activation memory itself, not the process's RSS."""

from __future__ import annotations

import pytest
import torch
from _helpers import (
    build_tiny_dir,
    make_groups,
    recipe,
    requires_megatron,
    saved_activations_worker,
    spawn_ranks,
)

from agent_rl.batch import collate

pytestmark = requires_megatron


def spec_recompute(model_dir, **learner):
    from agent_rl.learners.megatron import megatron_spec

    return megatron_spec(recipe(model_dir, backend="megatron", **learner).learner_spec).recompute


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2-sp"])
def test_recompute_keeps_fewer_activations_with_the_same_gradients(tp, tmp_path):
    from agent_rl.learners._pool import free_port

    model_dir = build_tiny_dir(tmp_path / "model")  # 2 layers
    settings = {
        "off": spec_recompute(model_dir),
        "full": spec_recompute(model_dir, gradient_checkpointing=True),  # uniform, 1 layer per chunk
        "full-block-1": spec_recompute(model_dir, gradient_checkpointing="full", recompute_method="block"),
        "selective-attn": spec_recompute(model_dir, gradient_checkpointing="selective"),
        "selective-attn-mlp": spec_recompute(
            model_dir, gradient_checkpointing="selective", recompute_modules=["core_attn", "mlp"]
        ),
    }
    assert (
        settings["off"].granularity is None and settings["full"].config(2)["recompute_granularity"] == "full"
    )
    batch = collate(make_groups(model_dir, seed=0, n_groups=2, n=3)).policy
    out = tmp_path / "saved.pt"
    spawn_ranks(
        saved_activations_worker,
        (tp, free_port(), str(model_dir), tp > 1, settings, batch, str(out)),
        tp,
    )
    got = torch.load(out)
    saved = {name: got[name][0] for name in settings}
    # full recompute keeps only each layer's input; block recomputes layer 1 of 2, keeps layer 2's activations;
    # selective drops what core attention keeps (its q, k, v, output and log-sum-exp; no scores with SDPA), and the MLP's
    assert saved["full"] < saved["full-block-1"] < saved["off"]
    assert saved["selective-attn-mlp"] < saved["selective-attn"] < saved["off"]
    assert saved["full"] < 0.5 * saved["off"]
    for name in settings:
        for param, grad in got["off"][1].items():
            torch.testing.assert_close(
                got[name][1][param], grad, rtol=1e-5, atol=1e-6, msg=f"{name}: {param}"
            )
