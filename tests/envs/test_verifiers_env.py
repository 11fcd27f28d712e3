"""`type: verifiers`: a verifiers 0.4 environment (examples/verifiers_arith, run by verifiers' own `null` harness)
trained for 2 steps by `agent-rl train` through the recording gateway. verifiers pins openai<3 and the agent
frameworks need openai>=3, so it lives in its own venv (`make verifiers`, run by `make test`); the run and the
taskset's answers are computed there, the checks here."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-verifiers" / "bin" / "python"
needs_venv = pytest.mark.skipif(not VENV.exists(), reason="no .venv-verifiers: `make verifiers` builds it")
ANSWERS = """
import json, verifiers.v1 as vf
from verifiers.v1.utils.loaders import load_taskset, resolve_env_config
ts = load_taskset(resolve_env_config({"taskset": {"id": "vf_tiny_arith", "num_tasks": 1200}}).taskset)
print(json.dumps({t.data.id: t.data.answer for t in ts}))
"""


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="verifiers is installed here")
def test_without_verifiers_the_env_yaml_is_refused_with_the_install_hint():
    import envs

    with pytest.raises(envs.ConfigError, match=r"env.yaml:\d+: verifiers: .*make verifiers"):
        envs.load(ROOT / "examples" / "verifiers_arith" / "env.yaml")


@needs_venv
def test_verifiers_env_trains_through_the_gateway_with_the_taskset_reward(tool_model, tmp_path):
    from transformers import AutoTokenizer

    from agent_rl.viewer.log import read_index, read_step

    run_dir = tmp_path / "run"
    cmd = [str(VENV), "-m", "agent_rl.cli", "train", str(ROOT / "recipes" / "verifiers_smoke.yaml")]
    cmd += ["--set", f"model.path={tool_model}", "--set", f"logging.run_dir={run_dir}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1] and records[-1]["learner/version"] == 2
    for r in records:
        assert r["rollout/errors"] == 0 and r["rollout/agent_calls_per_episode"] >= 1
        assert math.isfinite(r["rollout/reward_mean"])
    answers = json.loads(
        subprocess.run([str(VENV), "-c", ANSWERS], capture_output=True, text=True, check=True).stdout
    )
    tok = AutoTokenizer.from_pretrained(tool_model)
    seen = 0
    for summary in read_index(run_dir):
        for t in read_step(run_dir, summary.step).trajectories:
            sampled = [s for s in t.segments if s.sampled]
            assert sampled and all(
                len(s.behavior_logprobs) == len(s.token_ids) == len(s.versions) for s in sampled
            )
            assert all(v <= summary.learner_version for s in sampled for v in s.versions)
            # the reward is the taskset's @vf.reward of the harness's last reply (the last sampled segment)
            reply = tok.decode(sampled[-1].token_ids, skip_special_tokens=True)
            numbers = re.findall(r"-?\d+", reply)
            assert t.reward == float(bool(numbers) and numbers[-1] == answers[t.task_id]), (reply, t.task_id)
            seen += 1
    assert seen == 16  # 2 steps x 2 groups x 4
