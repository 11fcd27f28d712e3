"""The acceptance run: `agent-rl train` with mini-swe-agent (unmodified) as the agent of a small env
(recipes/harness_tiny.yaml) runs 3 steps end to end on CPU; its trajectories are in the viewer's log and its
forks in the metrics. mini-swe-agent, not Claude Code: its prompt does not name the episode's working directory,
so the model over-fitted in the test fixture still fits each episode's prompt (Claude Code's names it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]


def test_agent_rl_train_runs_mini_swe_agent_episodes_for_three_steps(mini_model, tmp_path):
    from agent_rl.config import load_recipe
    from agent_rl.trainer import train
    from agent_rl.viewer.log import read_index, read_step

    model_dir, _ = mini_model
    recipe = load_recipe(
        ROOT / "recipes" / "harness_tiny.yaml",
        [f"model.path={model_dir}", f"logging.run_dir={tmp_path / 'run'}"],
    )
    run_dir = train(recipe)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1]["learner/version"] == 3
    for r in records:
        assert math.isfinite(r["rollout/reward_mean"])
        # forks are counted: mini-swe-agent only appends, but a sampled reply that the template re-renders
        # differently (another JSON spacing of a tool call) starts one
        assert r["rollout/agent_splits"] >= 0
    assert max(r["rollout/reward_mean"] for r in records) > 0  # some episode's answer.txt held 12
    index = read_index(run_dir)
    assert [s.step for s in index] == [0, 1, 2]
    recorded = [t for s in index for t in read_step(run_dir, s.step, index).trajectories]
    assert recorded and all(t.segments for t in recorded)
    members = {t.uid: t for t in recorded if "." not in t.uid.rsplit("/", 1)[1]}
    for fork in (t for t in recorded if t.uid not in members):  # a fork carries its episode's reward
        member = next(m for uid, m in members.items() if fork.uid.startswith(uid + "."))
        assert fork.reward == member.reward
