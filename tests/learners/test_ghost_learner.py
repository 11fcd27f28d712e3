"""The torch learner with algorithm.opob_norms: ghost: the rank hands vcpo its functional output head, and the
step's gradient equals the per-trajectory exact OPOB's (tests/vcpo/test_ghost_norms.py covers the shapes)."""

from __future__ import annotations

from pathlib import Path

import torch
from float_bounds import drift
from learner_helpers import CPU, first_gradient, make_groups, recipe_for

from agent_rl.learners import build
from agent_rl.learners.torch_learner import rank_spec

# the two steps run the forward in other layouts (packed micro-batch vs one row per trajectory) and the backward
# in other groupings: 17 chained reductions of <= 512 terms forward and as many backward (the tiny model), fp32
RTOL = 2 * drift(512, 34, 1.0)


def test_ghost_norms_give_the_per_trajectory_exact_gradient(tiny_model_dir: Path, tmp_path: Path) -> None:
    groups = make_groups(tiny_model_dir, n_groups=2, n=3, noise=0.05)
    for norms in ("backward", "ghost"):
        lrn = build(recipe_for(tiny_model_dir, learner=CPU, algorithm={"opob_norms": norms}).learner_spec)
        assert (lrn.local._step.ghost is not None) is (norms == "ghost")
        lrn.step(groups)
        lrn.save(tmp_path / norms)
    want, got = first_gradient(tmp_path / "backward"), first_gradient(tmp_path / "ghost")
    diff = torch.cat([(got[k] - want[k]).flatten() for k in want]).norm()
    assert float(diff / torch.cat([w.flatten() for w in want.values()]).norm()) <= RTOL


def test_compiled_learner_keeps_the_per_trajectory_backward(tiny_model_dir: Path) -> None:
    spec = recipe_for(
        tiny_model_dir, learner={"compile": True}, algorithm={"opob_norms": "ghost"}
    ).learner_spec
    assert rank_spec(spec).step.opob_norms == "backward"  # torch.compile does not trace the ghost hooks
    spec = recipe_for(tiny_model_dir, algorithm={"opob_norms": "ghost"}).learner_spec
    assert rank_spec(spec).step.opob_norms == "ghost"
