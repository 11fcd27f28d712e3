"""The torch learner says where its step's time goes: forward passes and the optimizer, per step."""

from __future__ import annotations

from pathlib import Path

from learner_helpers import CPU, make_groups, recipe_for

from agent_rl.learners import build


def test_each_step_reports_its_own_forward_and_optimizer_seconds(tiny_model_dir: Path) -> None:
    learner = build(recipe_for(tiny_model_dir, learner=CPU).learner_spec)
    for _ in range(2):  # the second step's figures are its own, not the run's running sums
        m = learner.step(make_groups(tiny_model_dir, n_groups=2, n=2))
        fwd, opt = m["perf/learner_forward_seconds"], m["perf/learner_optimizer_seconds"]
        assert fwd > 0 and opt > 0
        # both inside the step as the facade timed it around the rank's call (same clock, nested)
        assert fwd + opt < m["learner/step_seconds"]
