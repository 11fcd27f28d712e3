"""The official openai client of an agent that runs in this process, answered without a socket.

`session_client(transport, sid)` is an `openai.AsyncOpenAI` whose HTTP client hands chat completions (and
model listings) straight to the gateway's handler (routes.py `chat_reply`, the one its aiohttp route
calls): the agent's code, the client's JSON request body and the JSON (or server-sent events) answer are
the same as over HTTP; what goes is the loopback socket, HTTP framing and parsing on both sides, and the
TLS context the client otherwise builds per instance (~25 ms of CPU, once per episode;
benchmarks/orchestration.py). Any other route (the Responses API, ...) goes to the gateway's HTTP server,
started at its first use. Agents in other processes use the HTTP server only. Either way a request passes
the gateway's one access check (access.py) with the key it carries: the client's api_key is its session's
token, which opens that session's routes and no other, and dies with the session.

Duck-typed against httpx's `AsyncBaseTransport`, so it serves whichever HTTP package the installed openai
client uses (`httpx2` for openai >= 3, `httpx` before).
"""

from __future__ import annotations

import re
from typing import Any

from agent_rl.gateway.routes import Reply, chat_reply, models_reply

_ROUTE = re.compile(r"/sessions/(?P<sid>[^/]+)/v1/(?P<route>chat/completions|models)")
BASE = "http://gateway.in-process"  # before the gateway's server runs: the transport answers or forwards all


def _http() -> Any:
    try:
        import httpx2 as http
    except ImportError:
        import httpx as http
    return http


class InProcessTransport:
    """An httpx transport in front of `gateway`: chat completions and models in-process, the rest over HTTP."""

    def __init__(self, gateway: Any):
        self.gateway, self.http = gateway, _http()
        self._forward: Any = None  # an HTTP transport to the gateway's server, made at the first other route

    async def handle_async_request(self, request: Any) -> Any:
        path = request.url.path
        where = f"{request.method} {path}"
        m = _ROUTE.fullmatch(path)
        if m and (refused := self._refusal(request, m)) is not None:
            reply = Reply.json(*refused)
        elif m and m["route"] == "chat/completions" and request.method == "POST":
            reply = await chat_reply(self.gateway, m["sid"], await request.aread(), where)
        elif m and m["route"] == "models" and request.method == "GET":
            reply = models_reply(self.gateway, m["sid"], where)
        else:
            return await self._over_http(request)
        return self.http.Response(
            reply.status, headers={"content-type": reply.content_type}, content=reply.body, request=request
        )

    def _refusal(self, request: Any, m: re.Match) -> tuple[int, dict] | None:
        """The gateway's access check (access.py), as its HTTP middleware runs it for the same route."""
        route = "/sessions/{sid}/v1/" + m["route"]
        auth = request.headers.get("authorization")
        return self.gateway.access.refusal(request.method, route, m["sid"], auth, request.url.path)

    async def _over_http(self, request: Any) -> Any:
        url = await self.gateway.ensure_started()
        if self._forward is None:
            self._forward = self.http.AsyncHTTPTransport()
        target = self.http.URL(url).copy_with(path=request.url.path, query=request.url.query or None)
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        forwarded = self.http.Request(request.method, target, headers=headers, content=await request.aread())
        return await self._forward.handle_async_request(forwarded)

    async def aclose(self) -> None:  # a session's client closing; the transport is the gateway's (close())
        return None

    async def close(self) -> None:
        if self._forward is not None:
            await self._forward.aclose()
            self._forward = None

    async def __aenter__(self) -> InProcessTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def session_client(transport: InProcessTransport, sid: str, token: str) -> Any:
    """An `openai.AsyncOpenAI` bound to session `sid` through `transport` (close it when the episode ends); its
    api_key is the session's `token` (never the gateway's key).

    Its `base_url` is the gateway server's real session URL once the server runs (rollout episodes start it
    first), so an agent that builds its own client from `client.base_url` (LangChain's ChatOpenAI, smolagents,
    verifiers' harness) reaches the same session over HTTP; this client's own requests never leave the process."""
    import openai

    http = transport.http.AsyncClient(transport=transport, timeout=None)
    # the session's token: a client an agent builds from this one (base_url, api_key) reaches this session only
    return openai.AsyncOpenAI(
        base_url=f"{transport.gateway.url or BASE}/sessions/{sid}/v1",
        api_key=token or "agent-rl",
        max_retries=0,
        timeout=None,
        http_client=http,
    )
