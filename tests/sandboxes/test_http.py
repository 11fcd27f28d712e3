"""The HTTP service (SandboxFusion-compatible /run_code, native API, sessions) and the "http" client backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

import sandboxes
from sandboxes import Limits, SandboxError
from sandboxes.cli import main as cli_main
from sandboxes.server import SandboxService


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    sb = sandboxes.create("local", pool_size=1)
    srv = TestServer(SandboxService(sb, Limits(timeout_s=5)).app())
    await srv.start_server()
    yield srv
    await srv.close()


async def test_run_code_speaks_sandboxfusion(server: TestServer) -> None:
    async with aiohttp.ClientSession() as http:
        ok = await (
            await http.post(
                server.make_url("/run_code"),
                json={"code": "print(input())", "stdin": "hi", "language": "python"},
            )
        ).json()
        bad = await (
            await http.post(server.make_url("/run_code"), json={"code": "1/0", "run_timeout": 5})
        ).json()
        slow = await (
            await http.post(
                server.make_url("/run_code"), json={"code": "while True: pass", "run_timeout": 0.5}
            )
        ).json()
    assert (
        ok["status"] == "Success"
        and ok["run_result"]["stdout"] == "hi\n"
        and ok["run_result"]["return_code"] == 0
    )
    assert bad["status"] == "Failed" and bad["run_result"]["status"] == "Error"
    assert "ZeroDivisionError" in bad["run_result"]["stderr"]
    assert slow["run_result"]["status"] == "TimeLimitExceeded"


async def test_bad_requests_get_400_naming_the_field(server: TestServer) -> None:
    async with aiohttp.ClientSession() as http:
        not_json = await http.post(server.make_url("/run_code"), data=b"{nope")
        no_code = await http.post(server.make_url("/run_code"), json={"stdin": "x"})
        wrong_type = await http.post(server.make_url("/v1/run"), json={"code": 5})
        bad_limit = await http.post(
            server.make_url("/v1/run"), json={"code": "pass", "limits": {"timeout_s": -1}}
        )
        bad_lang = await http.post(server.make_url("/run_code"), json={"code": "x", "language": "cobol"})
        statuses = [r.status for r in (not_json, no_code, wrong_type, bad_limit, bad_lang)]
        messages = [(await r.json())["message"] for r in (not_json, no_code, wrong_type, bad_limit, bad_lang)]
    assert statuses == [400] * 5
    assert "not valid JSON" in messages[0]
    assert "'code' is required" in messages[1]
    assert "field 'code'" in messages[2] and "int 5" in messages[2]
    assert "Limits.timeout_s must be > 0, got -1" in messages[3]
    assert "'cobol'" in messages[4]


async def test_http_backend_runs_calls_and_sessions_remotely(server: TestServer) -> None:
    async with sandboxes.create("http", url=str(server.make_url("/")), pool_size=4) as sb:
        await sb.start()
        results = await asyncio.gather(*(sb.run(f"print({i})") for i in range(20)))
        with_files = await sb.run("print(open('a.txt').read())", files={"a.txt": "content"})
        async with sb.session() as s:
            await s.run("y = 'kept'")
            kept = await s.run("print(y)")
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    assert with_files.stdout == "content\n"
    assert kept.stdout == "kept\n"


async def test_http_backend_reports_unreachable_service_as_sandbox_error() -> None:
    async with sandboxes.create("http", url="http://127.0.0.1:9", extra_timeout_s=2) as sb:
        with pytest.raises(SandboxError, match="127.0.0.1:9/v1/run failed"):
            await sb.run("print(1)")


async def test_slow_client_does_not_block_the_pool(server: TestServer) -> None:
    # A client that sends headers and only part of its body holds no sandbox (pool_size=1).
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    await writer.drain()
    async with aiohttp.ClientSession() as http:
        resp = await asyncio.wait_for(http.post(server.make_url("/v1/run"), json={"code": "print(7)"}), 20)
        assert (await resp.json())["stdout"] == "7\n"
    writer.close()


async def test_health_and_metrics(server: TestServer) -> None:
    async with aiohttp.ClientSession() as http:
        health = await http.get(server.make_url("/health"))
        metrics = await (await http.get(server.make_url("/metrics"))).text()
    assert health.status == 200 and (await health.json())["status"] == "ok"
    assert "agent_rl_sandbox_pool_calls 1" in metrics and "agent_rl_sandbox_http_requests_total" in metrics


def test_cli_rejects_unknown_subcommand() -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["bogus"])
    assert exc.value.code == 2
