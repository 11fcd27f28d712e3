"""The official openai client of an agent that runs in this process, answered without a socket.

`session_client(transport, sid)` is an `openai.AsyncOpenAI` whose HTTP client hands each request to the
gateway's own handler (`Gateway.chat_reply`, the one its aiohttp routes call): the agent's code, the
client's JSON request body and the JSON (or server-sent events) answer are the same as over HTTP;
what goes is the loopback socket, HTTP framing and parsing on both sides, and the TLS context the
client would otherwise build per instance (~25 ms of CPU each, once per episode;
benchmarks/orchestration.py). Agents in other processes use the HTTP routes (server.py).

The transport is duck-typed against httpx's `AsyncBaseTransport` so it serves whichever HTTP package
the installed openai client uses (`httpx2` for openai >= 3, `httpx` before).
"""

from __future__ import annotations

import re
from typing import Any

from agent_rl.openai.errors import error_body

_ROUTE = re.compile(r"/sessions/(?P<sid>[^/]+)/v1/(?P<route>chat/completions|models)")
BASE = "http://gateway.in-process"  # never resolved: the transport answers every request itself


def _http() -> Any:
    try:
        import httpx2 as http
    except ImportError:
        import httpx as http
    return http


class InProcessTransport:
    """An httpx transport that answers /sessions/{sid}/v1/{chat/completions,models} from `gateway`."""

    def __init__(self, gateway: Any):
        self.gateway, self.http = gateway, _http()

    async def handle_async_request(self, request: Any) -> Any:
        from agent_rl.gateway.server import Reply

        raw = await request.aread()
        path = request.url.path
        where = f"{request.method} {path}"
        m = _ROUTE.fullmatch(path)
        if m and m["route"] == "chat/completions" and request.method == "POST":
            reply = await self.gateway.chat_reply(m["sid"], raw, where)
        elif m and m["route"] == "models" and request.method == "GET":
            reply = self.gateway.models_reply(m["sid"], where)
        else:
            reply = Reply.json(404, error_body(404, f"{where}: no such route on the gateway"))
        return self.http.Response(
            reply.status, headers={"content-type": reply.content_type}, content=reply.body, request=request
        )

    async def aclose(self) -> None:  # shared by the sessions' clients; the gateway outlives them
        return None

    async def __aenter__(self) -> InProcessTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def session_client(transport: InProcessTransport, sid: str) -> Any:
    """An `openai.AsyncOpenAI` bound to session `sid` through `transport` (close it when the episode ends)."""
    import openai

    http = transport.http.AsyncClient(transport=transport, timeout=None)
    return openai.AsyncOpenAI(
        base_url=f"{BASE}/sessions/{sid}/v1",
        api_key="agent-rl",
        max_retries=0,
        timeout=None,
        http_client=http,
    )
