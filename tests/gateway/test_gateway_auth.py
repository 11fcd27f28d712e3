"""The gateway wants the run's key (bound to 127.0.0.2, a second "node" of this machine): the training run's
gateway and `agent-rl gateway` in front of an engine server that wants the same key."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from tool_model import TOOLS, conversation

from agent_rl.engines.api import EngineOptions
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.gateway.server import Gateway
from sandboxes.auth import KEY_ENV

openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")
KEY = "gateway-key-" + "g" * 32
ROOT = Path(__file__).resolve().parents[2]


async def test_the_runs_gateway_refuses_requests_without_its_key_and_hands_agents_their_sessions_token(
    tool_model,
):
    from transformers import AutoTokenizer

    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=4, max_seq_len=512), seed=0)
    gw = Gateway(
        engine, AutoTokenizer.from_pretrained(tool_model), max_seq_len=512, host="127.0.0.2", api_key=KEY
    )
    url = await gw.start()
    assert url.startswith("http://127.0.0.2:")
    gw.open("s1")
    inproc = gw.client("s1")
    try:
        for key in ("wrong", "agent-rl"):
            async with openai.AsyncOpenAI(base_url=gw.base_url("s1"), api_key=key, max_retries=0) as c:
                with pytest.raises(openai.AuthenticationError, match="wrong API key"):
                    await c.chat.completions.create(model="p", messages=conversation()[:1], tools=TOOLS)
        async with (
            aiohttp.ClientSession() as http
        ):  # the gateway serves on this event loop: no blocking client
            async with http.post(url + "/sessions", json={}) as opened:
                assert opened.status == 401 and (await opened.json())["error"]["code"] == "invalid_api_key"
            async with http.post(
                url + "/tasks/claim", json={}, headers={"Authorization": "Bearer x"}
            ) as claim:
                assert claim.status == 401
        assert gw.sessions.keys() == {"s1"} and gw.sessions["s1"].calls == []  # nothing reached a session
        # the agent's own client carries its session's token, never the gateway's key; a client an agent builds
        # from it (LangChain, smolagents) gets into that session too
        assert inproc.api_key == gw.sessions["s1"].token and KEY not in inproc.api_key
        r = await inproc.chat.completions.create(model="p", messages=conversation()[:1], tools=TOOLS)
        assert r.choices[0].message.tool_calls
        async with openai.AsyncOpenAI(
            base_url=str(inproc.base_url), api_key=inproc.api_key, max_retries=0
        ) as c:
            models = await c.models.list()
            assert models.data
    finally:
        await inproc.close()
        await gw.close()
        await engine.close()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def test_agent_rl_gateway_with_a_key_in_front_of_an_engine_server_that_wants_it(tool_model, monkeypatch):
    from agent_rl.engines.launch import launch_embedded

    monkeypatch.setenv(KEY_ENV, KEY)  # both inherit it: the engine server requires it, the gateway sends it
    engine = launch_embedded(str(tool_model), EngineOptions(max_batch=4, max_seq_len=512), threads=1)
    port = free_port("127.0.0.2")
    gw = subprocess.Popen(
        [sys.executable, "-m", "agent_rl.cli", "gateway", "--engines", engine.url, "--tokenizer", str(tool_model),
         "--host", "127.0.0.2", "--port", str(port), "--max-seq-len", "512"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = gw.stdout.readline().split(" on ")[1].split(": POST")[0]
        assert url == f"http://127.0.0.2:{port}"
        assert requests.post(url + "/sessions", json={}, timeout=60).status_code == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        opened = requests.post(
            url + "/sessions", json={"sampling": {"temperature": 0.0}}, headers=headers
        ).json()
        with openai.OpenAI(base_url=opened["base_url"], api_key=KEY, max_retries=0) as client:
            r = client.chat.completions.create(model="p", messages=conversation()[:1], tools=TOOLS)
        assert r.choices[0].message.tool_calls  # the gateway's engine client got through with the key
        closed = requests.post(
            f"{url}/sessions/{opened['session_id']}/close", json={"reward": 1.0}, headers=headers
        )
        assert closed.status_code == 200 and len(closed.json()["trajectories"]) == 1
    finally:
        gw.terminate()
        gw.wait(60)
        engine.stop()


def test_agent_rl_gateway_on_a_routable_address_without_a_key_is_refused_in_one_line(tool_model, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    out = subprocess.run(
        [sys.executable, "-m", "agent_rl.cli", "gateway", "--engines", "http://127.0.0.1:9", "--tokenizer",
         str(tool_model), "--host", "0.0.0.0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert (
        lines[0].startswith("agent-rl: agent-rl gateway: --host 0.0.0.0 is reachable")
        and "--insecure" in lines[0]
    )
