"""MCP tools: `agent-rl sandbox serve --mcp` driven by the mcp SDK's client, and an agent env whose agent gets
the episode's sandbox as an MCP server (its URL), run through the rollout loop and the recording gateway, with
the mcp SDK's client (examples/mcp_agent) and with the Agents SDK's MCPServerStreamableHttp."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import envs

pytest.importorskip("mcp")
DATA = Path(__file__).parent / "data"


async def mcp_call(url: str, code: str) -> tuple[list[str], str, bool]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as (read, write, *_), ClientSession(read, write) as session:
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("python", {"code": code})
        return tools, "".join(p.text for p in result.content), result.is_error


async def test_sandbox_serve_mcp_runs_code_under_the_service_limits():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "agent_rl.cli", "sandbox", "serve", "--mcp", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--timeout", "2", "--pool-size", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = await asyncio.to_thread(proc.stdout.readline)  # printed once it listens
        assert line.startswith("sandbox MCP server") and line.rstrip().endswith(f":{port}/mcp"), line
        url = f"http://127.0.0.1:{port}/mcp"
        tools, out, err = await mcp_call(url, "print(6 * 7)")
        assert tools == ["python"] and out == "42\n" and not err
        _, out, _ = await mcp_call(
            url, "import os\nprint(os.getuid())\n1/0"
        )  # sandboxed uid, stderr on failure
        assert out.startswith("65534\n") and "ZeroDivisionError" in out
        _, out, _ = await mcp_call(url, "while True: pass")  # the service's --timeout applies
        assert out.endswith("[timed out]")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


async def test_agent_gets_its_episode_sandbox_as_an_mcp_server_through_the_rollout_loop(tool_model):
    from test_agent_loop import run_rollouts
    from transformers import AutoTokenizer

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.engine import EmbeddedEngine

    spec = envs.load(DATA / "mcp_agent.yaml")
    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=8, max_seq_len=512), seed=0)
    try:
        (group,), rollouts = await run_rollouts(spec, tool_model, engine, groups=1)
    finally:
        await engine.close()
        await envs.close_shared_sandboxes()  # the run's MCP tool server
    tok = AutoTokenizer.from_pretrained(tool_model)
    assert rollouts.counters.errors == 0 and rollouts.counters.tool_calls == len(group.trajectories)
    for traj in group.trajectories:
        # the model called `python` (listed by MCP), the call ran in the episode's sandbox (counted by the env),
        # its output came back through MCP into the next prompt, and the model answered from it
        assert traj.turns[0].code_ran and not traj.turns[1].code_ran and traj.finish_reason.value == "answer"
        text = tok.decode(traj.response_ids)
        assert "<tool_response>\n12\n</tool_response>" in text and text.endswith(
            "The answer is 12.<|im_end|>"
        )


async def test_agents_sdk_mcp_server_streamable_http_through_the_gateway(tool_model):
    agents = pytest.importorskip("agents")
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
    from agents.mcp import MCPServerStreamableHttp
    from transformers import AutoTokenizer

    import sandboxes
    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.gateway.server import Gateway
    from sandboxes.mcp_server import McpToolServer, plain_output

    sandbox = sandboxes.create("local", pool_size=1)
    ran: list[str] = []

    async def run(code: str) -> str:
        ran.append(code)
        return plain_output(await sandbox.run(code))

    server = McpToolServer()
    await server.start()
    url = server.register("e1", run)
    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=4, max_seq_len=512), seed=0)
    gw = Gateway(engine, AutoTokenizer.from_pretrained(tool_model), max_seq_len=512, max_retries=0)
    await gw.start()
    gw.open("s1")
    try:
        client = openai.AsyncOpenAI(base_url=gw.base_url("s1"), api_key="x", max_retries=0)
        async with MCPServerStreamableHttp(params={"url": url}, name="sandbox") as mcp_server:
            agent = Agent(
                name="calc",
                model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                mcp_servers=[mcp_server],
            )
            result = await Runner.run(
                agent, "Compute 3 * 4", max_turns=3, run_config=RunConfig(tracing_disabled=True)
            )
        # the model's call of the MCP-listed `python` ran in the sandbox; its output came back in the next prompt,
        # which extends the first call's prompt + completion (one trajectory)
        assert ran == ["print(3 * 4)"] and isinstance(result.final_output, str)
        first, second = gw.sessions["s1"].calls
        assert (
            second.prompt_ids[: len(first.prompt_ids) + len(first.token_ids)]
            == first.prompt_ids + first.token_ids
        )
        after = gw.tok.decode(second.prompt_ids[len(first.prompt_ids) + len(first.token_ids) :])
        assert "<|im_start|>user\n<tool_response>\n12\n" in after, after
    finally:
        await gw.close()
        await engine.close()
        await server.close()
        await sandbox.close()
    del agents
