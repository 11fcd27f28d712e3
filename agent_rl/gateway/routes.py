"""The gateway's HTTP face: one handler per route, served by aiohttp (`Gateway.start`) to agents in other
processes, and, for chat completions and models, called directly by the in-process transport (inprocess.py)
for agents in this one: the same request body in and the same answer out either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from agent_rl.gateway.record import EngineFailed, SessionOver
from agent_rl.openai import anthropic_reply, chat, responses
from agent_rl.openai.errors import (
    NotFound,
    as_error,
    client_error,
    error_body,
    parse,
    parse_body,
    server_error,
)
from agent_rl.openai.protocol import ChatReq, warn_unknown

if TYPE_CHECKING:
    from agent_rl.gateway.session import Session, SessionHost

GATEWAY = web.AppKey("gateway", object)  # the Gateway an aiohttp app serves
# A session that is over (its budget spent, its group past the staleness bound, closed) answers 410 Gone: final
# for every client. A 409 is retried with backoff by the OpenAI and Anthropic SDKs, the AI SDK and Claude Code's
# own wrapper (which ignores `x-should-retry: false` on a 409): measured on the pinned harnesses, Claude Code
# spent 180 s on 11 attempts and OpenCode 70 s on 6 before giving up, an episode slot held for nothing.
SESSION_OVER = 410


@dataclass(frozen=True)
class Reply:
    """An HTTP answer of the gateway, whichever face sends it (aiohttp routes, the in-process transport)."""

    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, data: dict) -> Reply:
        return cls(status, json.dumps(data).encode())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/sessions/{sid}/v1/models", _models)
    app.router.add_post("/sessions/{sid}/v1/chat/completions", _chat)
    app.router.add_post("/sessions/{sid}/v1/responses", _responses)
    app.router.add_post("/sessions/{sid}/v1/messages", _messages)
    app.router.add_post("/sessions/{sid}/v1/messages/count_tokens", _count_tokens)


async def chat_reply(gw: SessionHost, sid: str, raw: bytes, where: str) -> Reply:
    """POST /sessions/{sid}/v1/chat/completions, body in, answer out (the aiohttp route and the in-process
    transport both call it): 410 when the session is over, 502 when the engines failed after retries
    (recorded as such), a request's own mistakes as OpenAI 4xx bodies (recorded as client errors), anything
    else a 500 with its traceback in the log (recorded as an error of the gateway, never the agent's)."""
    try:
        s = gw.session(sid)
    except NotFound as e:
        return Reply.json(*as_error(e, where))
    try:
        req = parse_body(raw, ChatReq)
        warn_unknown(req, "gateway /v1/chat/completions")
        body = await gw.complete(s, req)
    except Exception as e:
        return Reply.json(*_failed(s, e, where))
    if not req.stream:
        return Reply.json(200, body)
    return Reply(200, _events(body, req), "text/event-stream")


def _failed(s: Session, e: Exception, where: str) -> tuple[int, dict]:
    """The reply to a request of session `s` that raised `e`, recorded on the session by whose fault it was."""
    if isinstance(e, SessionOver):  # 410, not 409: see SESSION_OVER
        return SESSION_OVER, error_body(SESSION_OVER, str(e), code="session_over")
    if isinstance(e, EngineFailed):  # engine down after retries: a 502, and the episode records why
        s.stats.errors.append(str(e))
        return 502, error_body(502, e.public, code="engine_failed")  # no upstream URL to the agent
    reply = client_error(e, where)
    if reply is not None:
        s.stats.client_errors.append(f"{type(e).__name__}: {e}")
        return reply
    s.stats.errors.append(f"gateway internal error: {type(e).__name__}: {e}")
    return server_error(e, where)


def models_reply(gw: SessionHost, sid: str, where: str) -> Reply:
    """GET /sessions/{sid}/v1/models."""
    try:
        gw.session(sid)
    except NotFound as e:
        return Reply.json(*as_error(e, where))
    data = [{"id": gw.model_name, "object": "model", "owned_by": "agent-rl"}]
    return Reply.json(200, {"object": "list", "data": data})


def _events(body: dict, req: ChatReq) -> bytes:
    """A completed answer as server-sent events: one chunk per choice with the whole delta, then usage and
    [DONE] (the response is sent when complete: continuations across weight updates are hidden)."""
    head = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
    }
    out = []
    for ch in body["choices"]:
        delta = dict(ch["message"])
        if "tool_calls" in delta:
            delta["tool_calls"] = [dict(c, index=k) for k, c in enumerate(delta["tool_calls"])]
        choice = {
            "index": ch["index"],
            "delta": delta,
            "logprobs": ch["logprobs"],
            "finish_reason": ch["finish_reason"],
        }
        out.append({**head, "choices": [choice]})
    if req.stream_options is not None and req.stream_options.include_usage:
        out.append({**head, "choices": [], "usage": body["usage"]})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in out) + b"data: [DONE]\n\n"


def _send(r: Reply) -> web.Response:
    headers = {"Cache-Control": "no-cache"} if r.content_type == "text/event-stream" else None
    return web.Response(status=r.status, body=r.body, content_type=r.content_type, headers=headers)


async def _models(request: web.Request) -> web.Response:
    gw: SessionHost = request.app[GATEWAY]
    if anthropic_reply.is_anthropic(request):  # an Anthropic client: its list's shape
        gw.session(request.match_info["sid"])
        return web.json_response(anthropic_reply.models_list(gw.model_name))
    return _send(models_reply(gw, request.match_info["sid"], f"{request.method} {request.path}"))


async def _guarded(s: Session, request: web.Request, run) -> web.StreamResponse:
    """Run a request of session `s`; a failure is answered and recorded as `chat_reply` does (`_failed`)."""
    try:
        return await run()
    except web.HTTPException:
        raise
    except Exception as e:
        status, body = _failed(s, e, f"{request.method} {request.path}")
        return web.json_response(body, status=status)


async def _responses(request: web.Request) -> web.StreamResponse:
    """OpenAI's Responses API within a session (agent_rl/openai/responses.py); recorded like chat calls."""
    gw: SessionHost = request.app[GATEWAY]
    s = gw.session(request.match_info["sid"])
    store = gw.response_stores.setdefault(s.id, responses.Store())

    async def run():
        req = await parse(request, responses.ResponsesReq)
        warn_unknown(req, "gateway /v1/responses")
        return await responses.handle(request, req, store, lambda c: gw.complete(s, c))

    return await _guarded(s, request, run)


async def _chat(request: web.Request) -> web.Response:
    gw: SessionHost = request.app[GATEWAY]
    raw = await request.read()
    return _send(await chat_reply(gw, request.match_info["sid"], raw, f"{request.method} {request.path}"))


async def _messages(request: web.Request) -> web.StreamResponse:
    """Anthropic's Messages API within a session (agent_rl/openai/anthropic.py): converted to the chat request it
    is equivalent to and recorded like chat calls; a malformed request is a 400 and records no call."""
    gw: SessionHost = request.app[GATEWAY]
    s = gw.session(request.match_info["sid"])
    where = f"{request.method} {request.path}"

    async def complete(c: ChatReq) -> dict:
        body = await gw.complete(s, c)
        ch = body["choices"][0]  # n = 1, and nothing ran since: s.calls[-1] is this choice's call
        if (
            c.stop and ch["finish_reason"] == "stop"
        ):  # which stop sequence ended it (stop_reason stop_sequence)
            text = gw.codec.decode(s.calls[-1].token_ids, skip_special_tokens=c.skip_special_tokens)
            stops = [c.stop] if isinstance(c.stop, str) else list(c.stop)
            ch["stop_reason"] = anthropic_reply.first_stop(text, stops)
        return body

    return await anthropic_reply.handle_messages(
        request, gw.max_seq_len, complete, lambda e: _failed(s, e, where)
    )


async def _count_tokens(request: web.Request) -> web.Response:
    """The prompt ids' count a Messages request renders to, as a first call renders it; samples nothing."""
    gw: SessionHost = request.app[GATEWAY]
    gw.session(request.match_info["sid"])
    where = f"{request.method} {request.path}"

    def count(c: ChatReq) -> int:
        messages, tools = chat.template_messages(c.messages), chat.template_tools(c.tools)
        return len(gw.builder.prepare(messages, tools, c.chat_template_kwargs, ()).ids)

    return await anthropic_reply.handle_count_tokens(
        request, gw.max_seq_len, count, lambda e: as_error(e, where)
    )
