"""Every route of every service a run starts, probed with every kind of key, the probes GENERATED from each app's
route table: a route added later without a guard fails here. The kinds (agent_rl/auth.py):

- the control key (the run's): every route of every service;
- an episode's token (what a gateway session's agent is handed): that session's routes on the gateway, nothing else;
- the external agents' key: the gateway's POST /tasks/claim, nothing else;
- no key, a wrong key: GET /health only.

What a kind may reach is written here as the policy (`gateway_allows`), not read from the code under test. A
refusal is 401 or 403; an allowed probe is anything else (its body is empty or `{}`: a 400 or 404 from the handler
means the key got through). Refused probes never reach a handler, so the services' backends (an engine, a sandbox
pool) are real but idle."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent_rl.engines.api import EngineOptions
from agent_rl.gateway.server import Gateway

CONTROL = "control-key-" + "c" * 32
EXTERNAL = "external-key-" + "x" * 32
REFUSED = (401, 403)


class EngineNotCalled:
    """The gateway's engine for route probes: no probe here samples (bodies are empty), so no method exists."""

    resumes_constraints = False


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, path template) of every route the app serves (aiohttp adds HEAD beside each GET)."""
    out = set()
    for r in app.router.routes():
        canonical = r.resource.canonical if r.resource is not None else None
        if canonical is not None:
            out.add((r.method, canonical))
    return sorted(out)


def _fill(template: str, sid: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: sid if m.group(0) == "{sid}" else "x", template)


async def _status(http: aiohttp.ClientSession, method: str, url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = None if method in ("GET", "HEAD", "DELETE") else b"{}"
    if body is not None:
        headers["Content-Type"] = "application/json"
    async with http.request(method, url, data=body, headers=headers) as r:
        return r.status


@pytest.fixture
async def gateway(tool_model: Path) -> AsyncIterator[Gateway]:
    from transformers import AutoTokenizer

    gw = Gateway(
        EngineNotCalled(),  # type: ignore[arg-type]
        AutoTokenizer.from_pretrained(tool_model),
        max_seq_len=256,
        api_key=CONTROL,
        external_key=EXTERNAL,
    )
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()


def gateway_allows(kind: str, method: str, route: str) -> bool:
    """The policy: which kind of key may call which gateway route (probed on session A's routes)."""
    if method in ("GET", "HEAD") and route == "/health":
        return True
    if kind == "control":
        return True
    if kind == "token A":
        return route.startswith("/sessions/{sid}/")
    if kind == "external":
        return route == "/tasks/claim"
    return False  # no key, a wrong key, another session's token, a closed session's token


async def test_every_gateway_route_lets_each_kind_of_key_reach_only_what_it_may(gateway: Gateway) -> None:
    routes = _routes(gateway._runner.app)  # the table the server serves, whatever routes it holds today
    assert ("POST", "/sessions/{sid}/close") in routes and ("POST", "/sessions/{sid}/v1/responses") in routes
    assert ("GET", "/sessions/{sid}/v1/models") in routes and ("POST", "/tasks/claim") in routes
    n = 0
    async with aiohttp.ClientSession() as http:
        for method, route in routes:
            for kind in ("none", "wrong", "token A", "token B", "closed C", "external", "control"):
                # fresh sessions per probe: an allowed close must not change what the next probe sees
                a, b, c = (gateway.open(f"{x}{n}") for x in "ABC")
                gateway.close_session(c.id)  # its token died with it
                n += 1
                key = {"none": None, "wrong": "sess-wrong", "token A": a.token, "token B": b.token,
                       "closed C": c.token, "external": EXTERNAL, "control": CONTROL}[kind]  # fmt: skip
                status = await _status(http, method, gateway.url + _fill(route, a.id), key)
                if gateway_allows(kind, method, route):
                    assert status not in REFUSED, (kind, method, route, status)
                else:
                    assert status in REFUSED, (kind, method, route, status)
                for s in (a.id, b.id):
                    if s in gateway.sessions:
                        gateway.close_session(s)


async def test_an_unknown_path_on_the_gateway_is_refused_without_the_control_key(gateway: Gateway) -> None:
    token = gateway.open("A").token
    async with aiohttp.ClientSession() as http:
        for key in (None, token, EXTERNAL):
            assert await _status(http, "POST", gateway.url + "/admin/anything", key) in REFUSED
        assert await _status(http, "POST", gateway.url + "/admin/anything", CONTROL) == 404


async def test_an_episodes_client_carries_its_own_token_and_reaches_no_other_session(
    gateway: Gateway,
) -> None:
    """The in-process client (no socket) passes the same check as HTTP: its api_key is its session's token, never
    the control key, and a request it makes for another session is refused."""
    import openai

    from agent_rl.gateway.inprocess import session_client

    a, b = gateway.open("A"), gateway.open("B")
    client = gateway.client("A")
    stray = session_client(gateway._transport, "B", a.token)  # A's token, pointed at B's routes
    try:
        assert client.api_key == a.token and CONTROL not in (client.api_key, str(client.base_url))
        assert (await client.models.list()).data
        with pytest.raises(openai.PermissionDeniedError, match="only that session's routes"):
            await stray.models.list()
        with pytest.raises(openai.PermissionDeniedError):
            await stray.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        gateway.close_session("A")  # the token expires with its session
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
        assert b.calls == []
    finally:
        await client.close()
        await stray.close()


async def test_a_claim_answers_the_tasks_token_and_only_it_closes_that_task(gateway: Gateway) -> None:
    """External agents: the shared key claims; the claim's token closes that task; nobody else can close it or
    set its reward (another claim's token, the external key)."""
    import asyncio
    from types import SimpleNamespace

    from envs.agent import AgentOutcome

    tasks = [SimpleNamespace(id=f"t{i}", problem="1+1", numbers=()) for i in range(2)]
    envs_ = [SimpleNamespace(task=t, score=None) for t in tasks]
    for i in range(2):
        gateway.open(f"ext{i}")
    runs = [
        asyncio.create_task(gateway.board.run(e, f"ext{i}", 60.0, lambda: False)) for i, e in enumerate(envs_)
    ]
    async with aiohttp.ClientSession() as http:
        claimed = []
        for _ in range(2):
            async with http.post(
                gateway.url + "/tasks/claim",
                json={"wait_s": 5},
                headers={"Authorization": f"Bearer {EXTERNAL}"},
            ) as r:
                assert r.status == 200
                claimed.append(await r.json())
        first, second = claimed
        assert first["api_key"] != second["api_key"] and EXTERNAL not in (first["api_key"], second["api_key"])
        close = gateway.url + f"/sessions/{first['session_id']}/close"
        for key in (second["api_key"], EXTERNAL):  # another agent's token, the claim key: refused
            async with http.post(
                close, json={"reward": 1.0}, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                assert r.status == 403
        async with http.post(
            close, json={"reward": 0.5}, headers={"Authorization": f"Bearer {first['api_key']}"}
        ) as r:
            assert r.status == 200
        assert await runs[int(first["session_id"][-1])] == AgentOutcome(0.5, None)
    for t in runs:
        t.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.gather(*runs)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    import asyncio

    from agent_rl.engines.embedded.engine import EmbeddedEngine

    e = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=2, max_seq_len=64), seed=0)
    yield e
    asyncio.run(e.close())


async def test_every_engine_server_route_refuses_all_but_the_control_key(
    engine, tiny_model_dir, gateway
) -> None:
    """`agent-rl serve` / the run's engine servers (their routes with SGLang's and OpenAI's), with the run's
    control key: an episode's real token and the external key get 401 on every route but GET /health; the control
    key reads the GET routes (their handlers run: no state changes)."""
    from agent_rl.engines.embedded.server import build_app

    app = build_app(engine, str(tiny_model_dir), api_key=CONTROL)
    routes = _routes(app)
    for must in ("/get_model_info", "/server_info", "/get_load", "/get_weight_version", "/v1/models",
                 "/pause_generation", "/abort_request", "/update_weights_from_disk", "/load_lora_adapter",
                 "/unload_lora_adapter", "/init_weights_update_group"):  # fmt: skip
        assert any(r == must for _, r in routes), (must, routes)
    token = gateway.open("episode").token  # what an episode's agent holds
    runner, url = await _serve(app)
    try:
        async with aiohttp.ClientSession() as http:
            for method, route in routes:
                for key in (None, "wrong", token, EXTERNAL):
                    status = await _status(http, method, url + _fill(route, "x"), key)
                    if method in ("GET", "HEAD") and route == "/health":
                        assert status == 200
                    else:
                        assert status == 401, (key, method, route, status)
                if method == "GET":
                    assert await _status(http, method, url + _fill(route, "x"), CONTROL) == 200, route
    finally:
        await runner.cleanup()


async def test_every_sandbox_service_route_refuses_all_but_the_control_key(gateway) -> None:
    """`agent-rl sandbox serve`: run, sessions, their run and delete, metrics: 401 without the control key."""
    import sandboxes
    from sandboxes.server import SandboxService

    sandbox = sandboxes.create("local", pool_size=1)  # never started: no refused probe reaches it
    app = SandboxService(sandbox, api_key=CONTROL).app()
    routes = _routes(app)
    assert ("POST", "/v1/sessions/{sid}/run") in routes and ("DELETE", "/v1/sessions/{sid}") in routes
    assert ("POST", "/run_code") in routes and ("POST", "/v1/run") in routes
    token = gateway.open("episode").token
    runner, url = await _serve(app)
    try:
        async with aiohttp.ClientSession() as http:
            for method, route in routes:
                if method in ("GET", "HEAD") and route == "/health":
                    continue  # open, and it runs code: tested with a started pool in tests/sandboxes
                for key in (None, "wrong", token, EXTERNAL):
                    assert await _status(http, method, url + _fill(route, "1"), key) == 401, (
                        key,
                        method,
                        route,
                    )
            assert await _status(http, "GET", url + "/metrics", CONTROL) == 200
    finally:
        await runner.cleanup()


async def test_the_mcp_tool_server_opens_an_episodes_url_to_that_episodes_token_only() -> None:
    """The per-episode MCP server (`agent.mcp_servers`): an episode's URL takes that episode's session token (its
    agent's client's api_key) or the control key; another episode's token, or none, gets 401 (and /mcp, the
    server's own endpoint, takes the control key only)."""
    pytest.importorskip("mcp")
    from sandboxes.mcp_server import McpToolServer

    async def run(code: str) -> str:
        return "ran"

    server = McpToolServer(api_key=CONTROL)
    await server.start("127.0.0.1", 0)
    try:
        server.register("e1", run, token="sess-one")
        server.register("e2", run, token="sess-two")
        base = server.url().removesuffix("/mcp")
        async with aiohttp.ClientSession() as http:
            for path, key, refused in [
                ("/episodes/e1/mcp", "sess-one", False), ("/episodes/e1/mcp", CONTROL, False),
                ("/episodes/e1/mcp", "sess-two", True), ("/episodes/e1/mcp", None, True),
                ("/mcp", "sess-one", True), ("/mcp", CONTROL, False),
            ]:  # fmt: skip
                status = await _status(http, "POST", base + path, key)
                assert (status == 401) is refused, (path, key, status)
        server.unregister("e1")  # the episode ended: its token opens nothing
        async with aiohttp.ClientSession() as http:
            assert await _status(http, "POST", base + "/episodes/e1/mcp", "sess-one") == 401
    finally:
        await server.close()
