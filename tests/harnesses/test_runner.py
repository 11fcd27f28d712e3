"""envs/harness.py without a real harness (in `make test`): a command harness gets the session's settings, a
private HOME and a fresh working directory, and its answer file is the answer; a crash or a timeout is an
infrastructure failure carrying the harness's last lines, never a reward; a timed-out harness's tools die too."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import envs
from envs.harness import HarnessFailed, Launch, run, run_harness
from envs.types import Task

DATA = Path(__file__).parent / "data"
SCRIPT = """
import json, os, sys
keys = ["AGENT_RL_BASE_URL", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "HOME"]
json.dump({k: os.environ.get(k) for k in keys} | {"cwd": os.getcwd(), "argv": sys.argv[1:]}, open("seen.json", "w"))
open("answer.txt", "w").write(open("seen.json").read())
"""


def task() -> Task:
    return Task(id="t1", problem="Write 12 to answer.txt", answer="12")


async def test_a_command_harness_gets_the_session_a_private_home_and_its_answer_file_is_the_answer(tmp_path):
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/sessions/ep-1/v1", api_key="session-key")
    try:
        answer = await run(
            task(),
            client,
            None,
            command=[sys.executable, "-c", SCRIPT, "--task", "{prompt}"],
            answer_file="answer.txt",
            log_dir=str(tmp_path / "logs"),
        )
    finally:
        await client.close()
    import json

    seen = json.loads(answer)
    assert seen["AGENT_RL_BASE_URL"] == seen["OPENAI_BASE_URL"] == "http://127.0.0.1:9/sessions/ep-1/v1"
    assert seen["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/sessions/ep-1"  # Anthropic clients append /v1
    assert seen["OPENAI_API_KEY"] == "session-key"
    assert seen["argv"] == ["--task", "Write 12 to answer.txt"]
    assert Path(seen["HOME"]) != Path.home() and Path(seen["cwd"]).name == "work"
    assert not Path(seen["cwd"]).exists() and not Path(seen["HOME"]).exists()  # removed after the episode
    (logs,) = (tmp_path / "logs").iterdir()
    assert (logs / "stdout.txt").exists() and (logs / "stderr.txt").exists()  # kept


async def test_a_harness_past_its_time_limit_fails_and_its_background_tools_are_killed(tmp_path):
    script = "sleep 600 & echo $! > child.pid; echo started; sleep 60"  # its tool outlives it
    launch = Launch(["sh", "-c", script], {})
    with pytest.raises(HarnessFailed, match=r"(?s)sh ran past its 0.5 s limit.*\[stdout.txt\] started"):
        await run_harness(launch, tmp_path, tmp_path, tmp_path / "logs", timeout_s=0.5)
    pid = int((tmp_path / "child.pid").read_text())
    status = Path(f"/proc/{pid}/status")

    def alive() -> bool:  # a zombie of init is dead
        try:
            return "State:\tZ" not in status.read_text()
        except FileNotFoundError:
            return False

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30  # SIGKILL is delivered asynchronously: wait for it (not a timing assertion)
    while alive() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert not alive()


async def test_a_crashing_harness_ends_its_episode_as_an_infrastructure_error_with_its_last_lines(tool_model):
    from transformers import AutoTokenizer

    from agent_rl.buffer import RolloutBuffer
    from agent_rl.config import BufferConfig, RolloutConfig
    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.rollout.workers import PromptSource, Rollouts

    spec = envs.load(DATA / "crashing_harness.yaml")
    tok = AutoTokenizer.from_pretrained(tool_model)
    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=2, max_seq_len=512), seed=0)
    buffer = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=spec.group_size)
    rollouts = Rollouts(
        RolloutConfig(max_concurrent_episodes=2, max_errors=1),
        buffer,
        PromptSource(envs.make(spec, tok, None).tasks("train"), seed=0),
        lambda: envs.make(spec, tok, None),
        engine,
        max_seq_len=512,
        seed=0,
    )
    rollouts.start()
    try:
        with pytest.raises(RuntimeError, match=r"(?s)exited with 3.*boom: the harness died"):
            await asyncio.wait_for(buffer.take(1), 120)  # the errors reach the loop; no group is ever scored
    finally:
        await rollouts.stop()
        await engine.close()
    assert rollouts.counters.agent_errors >= 2 and rollouts.counters.errors >= 2
