"""Anthropic's Messages API, the answering half: the reply built from a chat completion, its server-sent
events, Anthropic's error bodies, and the route handlers `agent-rl serve` and the gateway share.

- `message(req, chat)`: the Message object. Content blocks in order `thinking` (the reasoning parser's
  `reasoning_content`, empty signature), `text`, `tool_use` (the tool parser's calls, input as an object).
  `stop_reason`: `tool_use` when the reply holds calls and the engine stopped by itself, `max_tokens` when
  it ran out, `stop_sequence` (with `stop_sequence`) when one of the request's stop sequences ended it,
  else `end_turn`.
- `events(message)`: Anthropic's stream for that Message: `message_start` (empty content, input usage),
  then per block `content_block_start`, one `content_block_delta` (`thinking_delta` then
  `signature_delta`, `text_delta`, or `input_json_delta` with the input's JSON), `content_block_stop`;
  a `ping` after the first block opens; `message_delta` (stop_reason, stop_sequence, usage) and
  `message_stop`. As the gateway's chat and Responses streams do, the events are sent once the reply
  is complete (tool calls are parsed from the whole output; continuations across weight updates stay
  hidden).
- Errors: `{"type": "error", "error": {"type": ..., "message": ...}}` with Anthropic's types by status
  (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error,
  413 request_too_large, 429 rate_limit_error, 500 api_error, 529 overloaded_error; another 4xx
  invalid_request_error, another 5xx api_error). `compat` is an aiohttp middleware, installed before the
  key check, that takes Anthropic's `x-api-key` header as the run's bearer key (the key check itself is
  the service's, unchanged) and rewrites any other error answer to an Anthropic client (a request to a
  Messages route, or one with an `anthropic-version` header) into Anthropic's body.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from agent_rl.openai import anthropic
from agent_rl.openai.errors import Invalid
from agent_rl.openai.protocol import ChatReq

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
ROUTES = ("/v1/messages", "/v1/messages/count_tokens")


def error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, body: dict) -> web.Response:
    """Anthropic's error answer for (status, OpenAI error body) as errors.as_error and the gateway give them."""
    message = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else None
    return web.json_response(error_body(status, message or json.dumps(body)), status=status)


def is_anthropic(request: web.Request) -> bool:
    return "anthropic-version" in request.headers or request.path.endswith(ROUTES)


@web.middleware
async def compat(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
    key = request.headers.get("x-api-key")
    if key and "Authorization" not in request.headers:
        headers = CIMultiDict(request.headers)
        headers["Authorization"] = f"Bearer {key}"
        request = request.clone(headers=headers)
    if not is_anthropic(request):
        return await handler(request)
    try:
        resp = await handler(request)
    except web.HTTPException as e:  # no such route, a body over the size limit, ...
        if e.status < 400:
            raise
        return web.json_response(
            error_body(e.status, f"{request.method} {request.path}: {e.reason}"), status=e.status
        )
    if resp.status >= 400 and isinstance(resp, web.Response) and resp.content_type == "application/json":
        try:
            body = json.loads(resp.body)
        except (TypeError, ValueError):
            return resp
        if isinstance(body, dict) and body.get("type") != "error":
            return error_response(resp.status, body)
    return resp


def models_list(name: str) -> dict:
    """GET /v1/models as Anthropic answers it (the one served model)."""
    info = {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
        "lifecycle": "active",
    }
    return {"data": [info], "has_more": False, "first_id": name, "last_id": name}


def message(req: anthropic.MessagesReq, chat: dict) -> dict:
    ch = chat["choices"][0]
    msg = ch["message"]
    content: list[dict] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for c in msg.get("tool_calls") or []:
        tid = "toolu_" + c["id"].removeprefix("call_")
        content.append(
            {
                "type": "tool_use",
                "id": tid,
                "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"]),
            }
        )
    stop_sequence = None
    if ch["finish_reason"] == "length":
        reason = "max_tokens"
    elif msg.get("tool_calls"):
        reason = "tool_use"
    else:
        stop_sequence = matched_stop(ch, req.stop_sequences or [])
        reason = "end_turn" if stop_sequence is None else "stop_sequence"
    usage = chat["usage"]
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def matched_stop(choice: dict, stops: list[str]) -> str | None:
    """The stop sequence that ended a choice: the engine's match (`stop_reason`, as serve reports it and the
    gateway's route fills it in, `first_stop`)."""
    matched = choice.get("stop_reason")
    return matched if isinstance(matched, str) and matched in stops else None


def first_stop(text: str, stops: list[str]) -> str | None:
    """The stop sequence found first in a sampled text (the engine stops at the first match)."""
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits)[1] if hits else None


def events(msg: dict) -> list[tuple[str, dict]]:
    """The stream of `msg` as (event name, data) pairs, in Anthropic's order (module docstring)."""
    start = {**msg, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**msg["usage"], "output_tokens": 0}
    out: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "thinking":
            opened, deltas = (
                {**block, "thinking": "", "signature": ""},
                [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ],
            )
        elif block["type"] == "text":
            opened, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        else:
            args = json.dumps(block["input"], ensure_ascii=False)
            opened, deltas = {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": args}]
        out.append(
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": opened})
        )
        if i == 0:
            out.append(("ping", {"type": "ping"}))
        out += [
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}) for d in deltas
        ]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    if not msg["content"]:
        out.append(("ping", {"type": "ping"}))
    delta = {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]}
    out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": msg["usage"]}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def sse(msg: dict) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events(msg))


def respond(req: anthropic.MessagesReq, chat: dict) -> web.Response:
    msg = message(req, chat)
    if not req.stream:
        return web.json_response(msg)
    return web.Response(
        body=sse(msg), content_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def body_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Invalid(f"malformed JSON body: {e}") from None


async def handle_messages(
    request: web.Request,
    max_seq_len: int,
    complete: Callable[[ChatReq], Awaitable[dict]],
    failed: Callable[[Exception], tuple[int, dict]],
) -> web.StreamResponse:
    """POST /v1/messages: parse and convert (a mistake is a 400 before anything is sampled or recorded),
    complete as chat, answer as a Message (JSON or events); `failed` gives (status, OpenAI body) of an error."""
    try:
        req = anthropic.parse(anthropic.MessagesReq, await body_json(request))
        chat = await complete(anthropic.to_chat(req, max_seq_len))
    except web.HTTPException:
        raise
    except Exception as e:
        return error_response(*failed(e))
    return respond(req, chat)


async def handle_count_tokens(
    request: web.Request,
    max_seq_len: int,
    count: Callable[[ChatReq], int],
    failed: Callable[[Exception], tuple[int, dict]],
) -> web.Response:
    """POST /v1/messages/count_tokens: the prompt's length, rendered as /v1/messages would render it."""
    try:
        req = anthropic.parse(anthropic.CountTokensReq, await body_json(request))
        n = count(anthropic.to_chat(req, max_seq_len))
    except web.HTTPException:
        raise
    except Exception as e:
        return error_response(*failed(e))
    return web.json_response({"input_tokens": n})
