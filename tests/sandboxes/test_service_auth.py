"""`agent-rl sandbox serve` (HTTP and --mcp) bound to 127.0.0.2, a second "node" of this machine, as a run starts
it: every request but GET /health needs the key, and the "http" backend sends it."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest

import sandboxes
from sandboxes import SandboxError
from sandboxes.auth import KEY_ENV
from sandboxes.http_client import HttpOptions, HttpSandbox

KEY = "sandbox-key-" + "s" * 32
HOST = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def serve(*extra: str, env_key: str | None = KEY) -> tuple[subprocess.Popen, str]:
    """`python -m sandboxes serve` on HOST with the key in its environment (as a run passes it); its first line."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV} | ({KEY_ENV: env_key} if env_key else {})
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "sandboxes",
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
        "--pool-size",
        "1",
    ]
    proc = subprocess.Popen(
        [*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    return proc, proc.stdout.readline()


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    proc, line = serve()
    assert line.startswith("sandbox service") and f"http://{HOST}:" in line, line
    yield line.split(" on ")[1].strip()
    proc.terminate()
    assert proc.wait(timeout=60) == 0


@pytest.mark.parametrize("route", ["/run_code", "/v1/run", "/v1/sessions", "/metrics"])
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Token {KEY}"}]
)
async def test_requests_without_the_key_are_refused_with_401(service: str, route: str, headers: dict) -> None:
    async with aiohttp.ClientSession(headers=headers) as http:
        method = http.get if route == "/metrics" else http.post
        async with method(service + route, json={"code": "print(1)"}) as r:
            assert r.status == 401, await r.text()
            assert (await r.json())["error"]["code"] == "invalid_api_key"
        async with http.get(service + "/health") as r:
            assert r.status == 200  # open: launchers wait on it


async def test_the_http_backend_sends_the_key_and_runs_code(service: str, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    async with sandboxes.create("http", url=service) as keyless:
        with pytest.raises(SandboxError, match="HTTP 401"):
            await keyless.run("print(1)")
    async with HttpSandbox(HttpOptions(url=service), api_key=KEY) as sb:
        assert (await sb.run("print(1 + 1)")).stdout == "2\n"
    monkeypatch.setenv(KEY_ENV, KEY)  # a run's key, as the run's sandbox client reads it
    async with sandboxes.create("http", url=service) as sb:
        assert (await sb.run("print(6 * 7)")).stdout == "42\n"
        async with sb.session() as s:
            await s.run("x = 41")
            assert (await s.run("print(x + 1)")).stdout == "42\n"


def test_sandbox_serve_on_a_routable_address_without_a_key_is_refused_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sandboxes", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != KEY_ENV},
    )  # fmt: skip
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("agent-rl: agent-rl sandbox serve: --host 0.0.0.0 is reachable")


async def test_the_mcp_tool_server_wants_the_key_too() -> None:
    pytest.importorskip("mcp")
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    proc, line = serve("--mcp")
    try:
        assert line.startswith("sandbox MCP server") and f"http://{HOST}:" in line, line
        url = line.split(": ", 1)[1].strip()

        async def call(headers: dict[str, str]) -> str:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
                streamable_http_client(url, http_client=http) as (read, write, *_),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                result = await session.call_tool("python", {"code": "print(6 * 7)"})
                return "".join(p.text for p in result.content)

        async with aiohttp.ClientSession() as http, http.post(url, json={}) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
        with pytest.raises(
            ExceptionGroup
        ) as refused:  # the SDK raises the 401 as an error inside its task group
            await asyncio.wait_for(call({"Authorization": "Bearer wrong"}), 120)
        assert refused.group_contains(MCPError, depth=None), repr(refused.value)
        assert await asyncio.wait_for(call({"Authorization": f"Bearer {KEY}"}), 120) == "42\n"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
