"""benchmarks/trl_swe.py's SweTinyEnv (the TRL cell's environment_factory) in real containers (the private dockerd of
conftest.py), driven as TRL's GRPOTrainer drives it: reset(**row), awaited bash tool calls, then the reward function
over the rollouts' environments. TRL itself is not needed: the env is a plain class (TRL's own loop runs it in
benchmarks/slow_tools.py --quick: tests/sandboxes/test_slow_tools_quick.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks.trl_swe import SweTinyEnv, _Suite, verdicts
from envs.harbor.generate import write_task
from envs.loop_resources import close_shared_sandboxes

pytestmark = pytest.mark.docker


def _episodes(
    task: str, scripts: dict[str, list[str]]
) -> tuple[dict[str, list[str]], dict[str, float | None]]:
    """One rollout per name (all on one event loop, as TRL's): its bash calls in turn, then every verdict at once."""

    async def go():
        envs = {name: SweTinyEnv() for name in scripts}
        for e in envs.values():
            e.reset(task_id=task, prompt=[])  # TRL passes the whole row
        outs = {name: [await envs[name].bash(c) for c in cmds] for name, cmds in scripts.items()}
        rewards = await verdicts(list(envs.values()))
        await close_shared_sandboxes()
        return outs, dict(zip(envs, rewards, strict=True))

    return asyncio.run(go())


@pytest.mark.slow
def test_a_rollouts_tool_calls_and_its_verdict_share_one_container_and_no_container_is_left(
    docker_host: str, tiny_model_dir: Path, tmp_path: Path
):
    import docker
    from transformers import AutoTokenizer

    from sandboxes.docker_engine import our_containers

    d = write_task(tmp_path / "tasks", 0)
    env = {"name": "t", "type": "harbor", "group_size": 2,
           "harbor": {"tasks": str(tmp_path / "tasks"), "heldout_fraction": 0.0, "docker_host": docker_host},
           "turns": {"max_turns": 4, "max_tokens_per_turn": 64, "max_response_tokens": 256}}  # fmt: skip
    (tmp_path / "env.yaml").write_text(json.dumps(env))
    _Suite.load(tmp_path / "env.yaml", AutoTokenizer.from_pretrained(tiny_model_dir))
    _Suite.take()
    fix = (d / "solution" / "solve.sh").read_text().split("\n", 1)[1]
    module = next((d / "environment" / "app").glob("*.py")).name
    outs, rewards = _episodes(
        next(iter(_Suite.tasks)), {"fixer": ["ls /app", fix], "idle": ["false"], "none": []}
    )
    assert module in outs["fixer"][0]  # `ls /app` ran in the task's container
    assert outs["idle"][0].endswith("(exit status 1)")  # as the built-in agent shows a failed command
    # the fix made by a tool call is what the verifier judged: the same container from the first call to the verdict
    assert rewards == {"fixer": 1.0, "idle": 0.0, "none": 0.0}
    episodes, infra = _Suite.take()
    assert len(episodes) == 3 and infra == [] and all(e["tool_s"] > 0 for e in episodes)
    assert our_containers(docker.DockerClient(base_url=docker_host)) == []
