"""External agents: an agent process claims tasks from `agent-rl train`'s gateway over HTTP and is trained with
the tokens, log-probs and versions it sampled; `agent-rl gateway` serves sessions opened over HTTP."""

from __future__ import annotations

import faulthandler
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tool_model import TOOLS, conversation

pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def _listening(port: int) -> str:
    """Whether something still accepts connections on `port` (a run's gateway should have closed it)."""
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as e:
            return f"the gateway's port refuses connections ({e})"
    return "the gateway's port still accepts connections after the run"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what an agent holds: the external agents' key, and each claim's session token (`sess-` + 43 characters)
EXTERNAL = "external-key-" + "x" * 32
AGENT_KEYS = re.compile(rb"sess-[A-Za-z0-9_-]{40,}|" + re.escape(EXTERNAL.encode()))


def test_an_external_agent_process_is_trained_with_the_versions_it_sampled(
    tool_model, tmp_path, monkeypatch, capfd
):
    from agent_rl.config import load_recipe
    from agent_rl.trainer import train
    from agent_rl.viewer.log import read_index, read_step

    port = free_port()
    env = tmp_path / "external.yaml"
    env.write_text(
        f"""name: external_compute
type: external
external: {{port: {port}, timeout_s: 300}}
data: {{root: "{DATA}", splits: {{train: {{path: compute.jsonl}}}}}}
turns: {{max_turns: 2, max_tokens_per_turn: 96, max_response_tokens: 256}}
reward: {{type: integer}}
group_size: 2
"""
    )
    log = tmp_path / "agent.jsonl"
    # an external env's agents claim with a key of their own, never the run's: the user sets it for the run and
    # gives it to the agents; each claim answers that task's session token
    monkeypatch.setenv("AGENT_RL_EXTERNAL_AGENT_KEY", EXTERNAL)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.external_agent.agent",
            f"http://127.0.0.1:{port}",
            "--log",
            str(log),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # the agent is up before the run's gateway (as a user starting it first would have it): it waits
        assert agent.stdout.readline().startswith("waiting for the gateway at"), "the agent did not wait"
        recipe = load_recipe(
            ROOT / "recipes" / "agent_arith_smoke.yaml",
            [
                f"model.path={tool_model}",
                f"logging.run_dir={tmp_path / 'run'}",
                f"envs.train={env}",
                "train.steps=3",
                "train.batch_prompts=1",
                "buffer.max_staleness=1",
                "logging.trajectories=all",
                "checkpoint.every=0",
            ],
        )
        run_dir = train(recipe)
        try:  # it stops by itself when the run ends (its waiting claim is answered 410, or the port closes)
            rc = agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # its KeyboardInterrupt traceback (stderr, below) says where it hung; this process's threads (the
            # rollout loop's, if it outlived the run) and whether the gateway's port still accepts say why
            faulthandler.dump_traceback(all_threads=True)
            agent.send_signal(signal.SIGINT)
            agent.wait(10)
            pytest.fail(f"the external agent did not stop within 60 s of the run's end; {_listening(port)}")
        assert rc == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    received = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        received[rec["session_id"]] = rec["logprobs"]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and records[-1]["learner/version"] == 3
    trained = 0
    for summary in read_index(run_dir):
        for t in read_step(run_dir, summary.step).trajectories:
            sampled = [s for s in t.segments if s.sampled]
            # every trained token is one the external agent was sent, with the log-prob it was sent
            assert [s.behavior_logprobs for s in sampled] == received[t.uid.replace("/", "-")]
            versions = {v for s in sampled for v in s.versions}
            assert versions and summary.step - 1 <= min(versions) and max(versions) <= summary.step
            trained += 1
    assert trained == 3 * 2
    # no agent's key reaches the run's files (trajectories, metrics, logs) or what the run printed. Mutant: the
    # claim route printing the claim it answers (its token) fails here
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert not AGENT_KEYS.search(f.read_bytes()), f"an agent's key in {f}"
    out, err = capfd.readouterr()
    assert not AGENT_KEYS.search((out + err).encode()), "an agent's key in the run's output"


def test_agent_rl_gateway_serves_sessions_opened_over_http_with_sampling_and_budgets(tool_model, tmp_path):
    import openai
    import requests

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.launch import launch_embedded

    engine = launch_embedded(str(tool_model), EngineOptions(max_batch=4, max_seq_len=512), threads=1)
    record = tmp_path / "sessions.jsonl"
    gw = subprocess.Popen(
        [sys.executable, "-m", "agent_rl.cli", "gateway", "--engines", engine.url, "--tokenizer", str(tool_model),
         "--port", "0", "--max-seq-len", "512", "--record", str(record)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = gw.stdout.readline().split(" on ")[1].split(": POST")[0]  # "agent-rl gateway on URL: POST ..."
        opened = requests.post(
            url + "/sessions",
            json={"sampling": {"temperature": 0.0}, "limits": {"max_calls": 1, "max_tokens_per_call": 96}},
        ).json()
        client = openai.OpenAI(base_url=opened["base_url"], api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="p", messages=conversation()[:1], tools=TOOLS, logprobs=True, temperature=1.5
        )
        assert r.choices[0].message.tool_calls  # temperature forced to 0: the model's greedy tool call
        with pytest.raises(openai.APIStatusError, match="call budget") as over:
            client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        assert over.value.status_code == 410
        closed = requests.post(f"{url}/sessions/{opened['session_id']}/close", json={"reward": 1.0}).json()
        (traj,) = closed["trajectories"]
        sampled = [lp for lp, m in zip(traj["logprobs"], traj["loss_mask"], strict=True) if m]
        assert sampled == [x.logprob for x in r.choices[0].logprobs.content] and closed["reward"] == 1.0
        assert set(traj["versions"]) == {-1, 0}
        assert json.loads(record.read_text())["session_id"] == opened["session_id"]
        bad = requests.post(url + "/sessions", json={"limits": {"max_calls": 0}})
        assert bad.status_code == 400 and "max_calls" in bad.json()["error"]["message"]
    finally:
        gw.terminate()
        gw.wait(timeout=30)
        engine.stop()
