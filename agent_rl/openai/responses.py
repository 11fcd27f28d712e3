"""OpenAI's Responses API (`POST /v1/responses`) on `serve` and the gateway, as a translation to and from chat.

A request's `instructions` and `input` items become chat messages (message items, `function_call` ->
an assistant message with tool calls, `function_call_output` -> a tool message; `reasoning` items are
dropped), function `tools` and `tool_choice` become chat tools, `text.format` becomes `response_format`,
and the chat completion comes back as output items (`message` with `output_text`, `function_call`).
`previous_response_id` continues a stored conversation: the earlier request's messages and the
assistant message it got, then the new input (on the gateway, within one session; `serve` keeps the
last `STORE` responses). Because the conversation is rebuilt as exactly the earlier messages plus the
returned message, the gateway's prefix-extension rule holds and a Responses agent stays one trajectory.
Streaming (`stream: true`) sends the complete response as Responses events once it is sampled
(response.created ... output_text.delta / function_call_arguments.delta ... response.completed).

Tools, as a Responses server takes them from clients such as Codex CLI (which sends function, namespace and
web_search tools on every request): `function` tools are offered as chat tools; a `namespace` tool is a group
of function tools, offered flat under their own names (a call of one comes back with the namespace in the
`function_call` item's `namespace` field; two tools of one name are refused with a 400). Hosted tools that
OpenAI's servers run (`web_search`, `file_search`, `code_interpreter`, `image_generation`, `computer_use`,
`mcp`, `local_shell`, ...) have no runner here: they are accepted and NOT offered to the model, with one
warning per tool type in the log, so a client that always sends them still works; a `tool_choice` that names
one is refused (400), since honouring it would need the tool. Fields that do not change what is sampled are
accepted and ignored: `store`, `include` (no encrypted reasoning exists here), `prompt_cache_key`,
`client_metadata`, `metadata`, `user`, `safety_identifier`, `service_tier`, `truncation: disabled`, and
`reasoning` (the model's chat template decides whether it reasons; `effort` and `summary` are not sampling
parameters of the engine, so no request is sampled differently for them).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import Field

from agent_rl.openai.errors import Invalid, NotFound, validate
from agent_rl.openai.protocol import ChatReq, Lenient

log = logging.getLogger(__name__)
STORE = 1000  # responses `serve` remembers for previous_response_id
_warned_hosted: set[str] = set()


class ResponsesReq(Lenient):
    model: str | None = None
    input: str | list[dict] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None
    text: dict | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    store: bool | None = None
    metadata: dict | None = None
    # accepted and ignored: none of them changes what is sampled (module docstring)
    reasoning: dict | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    truncation: Literal["disabled"] | None = None
    seed: int | None = None  # not OpenAI's; vLLM-style extras are passed on to chat
    top_k: int = -1


def _field(item: dict, key: str, where: str) -> Any:
    """`item[key]`; a missing key is the request's mistake (400 naming the item and the key)."""
    if key not in item:
        raise Invalid(f"{where}: {item.get('type', 'message')} item needs {key!r}", param="input")
    return item[key]


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise Invalid(f"{where}: content must be a string or a list of parts, got {content!r}", param="input")
    parts = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else type(p).__name__
        if kind not in ("input_text", "output_text", "text"):
            raise Invalid(
                f"{where}: content part of type {kind!r} is not supported (text only)", param="input"
            )
        parts.append(p.get("text", ""))
    return "".join(parts)


def input_messages(items: str | list[dict]) -> list[dict]:
    """Responses input items -> chat messages (consecutive function calls join one assistant message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, it in enumerate(items):
        kind = it.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            out.append({"role": _field(it, "role", where), "content": _text(it.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": _field(it, "call_id", where),
                "type": "function",
                "function": {"name": _field(it, "name", where), "arguments": _field(it, "arguments", where)},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _field(it, "call_id", where),
                    "content": _text(output, where),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise Invalid(f"{where}: item type {kind!r} is not supported", param="input")
    return out


def chat_tools(tools: list[dict] | None) -> tuple[list[dict] | None, dict[str, str]]:
    """Responses tools -> chat tools (namespaces flattened, hosted tools left out: module docstring), and the
    namespace of each flattened tool's name."""
    if not tools:
        return None, {}
    out: list[dict] = []
    namespace_of: dict[str, str] = {}
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function":
            out.append(_function(t, f"tools[{i}]"))
        elif kind == "namespace":
            inner = t.get("tools")
            if not isinstance(inner, list):
                raise Invalid(
                    f"tools[{i}]: a namespace tool needs a list of tools, got {inner!r}", param="tools"
                )
            for j, sub in enumerate(inner):
                where = f"tools[{i}].tools[{j}]"
                if not isinstance(sub, dict) or sub.get("type") != "function":
                    got = sub.get("type") if isinstance(sub, dict) else sub
                    raise Invalid(f"{where}: a namespace holds function tools, got {got!r}", param="tools")
                out.append(_function(sub, where))
                namespace_of[sub["name"]] = str(t.get("name"))
        elif isinstance(kind, str) and kind:
            if kind not in _warned_hosted:
                _warned_hosted.add(kind)
                log.warning(
                    "responses: tool type %r is a hosted tool with no runner here: accepted, not offered to the model",
                    kind,
                )
        else:
            raise Invalid(f"tools[{i}] needs a type (function, namespace, ...), got {t!r}", param="tools")
    names = [c["function"]["name"] for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Invalid(
            f"tool names must be unique once namespaces are flattened; {twice} occur twice", param="tools"
        )
    return out or None, namespace_of


def _function(t: dict, where: str) -> dict:
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise Invalid(f"{where}: a function tool needs a name", param="tools")
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def to_chat(req: ResponsesReq, previous: list[dict]) -> tuple[ChatReq, list[dict]]:
    """The chat request, and its messages (stored so a later previous_response_id continues them)."""
    messages = list(previous)
    if req.instructions and not previous:
        messages.append({"role": "developer", "content": req.instructions})
    messages += input_messages(req.input)
    if not messages:
        raise Invalid("input is empty", param="input")
    fmt = (req.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise Invalid(f"text.format must be an object, got {fmt!r}", param="text.format")
    response_format = None
    if fmt and fmt.get("type") == "json_schema":
        response_format = {
            "type": "json_schema",
            "json_schema": {k: v for k, v in fmt.items() if k != "type"},
        }
    elif fmt:
        response_format = fmt
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, dict):
        raise Invalid(
            f"tool_choice {choice!r} names a hosted tool, which has no runner here (function tools only)",
            param="tool_choice",
        )
    tools, _ = chat_tools(req.tools)
    body = {
        "model": req.model,
        "messages": messages,
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "seed": req.seed,
        "logprobs": bool(req.top_logprobs is not None),
        "top_logprobs": req.top_logprobs,
    }
    return validate(ChatReq, {k: v for k, v in body.items() if v is not None}), messages


def to_response(req: ResponsesReq, chat: dict, rid: str) -> dict:
    ch = chat["choices"][0]
    msg = ch["message"]
    output: list[dict] = []
    if msg.get("content"):
        lps = ch.get("logprobs") or {}
        part = {"type": "output_text", "text": msg["content"], "annotations": []}
        if lps.get("content") is not None:
            part["logprobs"] = lps["content"]
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    _, namespace_of = chat_tools(req.tools)
    for c in msg.get("tool_calls") or []:
        item = {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex}",
            "call_id": c["id"],
            "name": c["function"]["name"],
            "arguments": c["function"]["arguments"],
            "status": "completed",
        }
        if c["function"]["name"] in namespace_of:
            item["namespace"] = namespace_of[c["function"]["name"]]
        output.append(item)
    length = ch["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": rid,
        "object": "response",
        "created_at": chat["created"],
        "status": "incomplete" if length else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "error": None,
        "model": chat["model"],
        "output": output,
        "instructions": req.instructions,
        "tools": req.tools or [],
        "tool_choice": req.tool_choice or "auto",
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "text": req.text or {"format": {"type": "text"}},
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


class Store:
    """Conversations by response id (messages sent + the assistant message returned), oldest dropped first."""

    def __init__(self, size: int = STORE):
        self.size, self.items = size, OrderedDict[str, list[dict]]()

    def get(self, rid: str | None) -> list[dict]:
        if rid is None:
            return []
        if rid not in self.items:
            raise NotFound(f"previous_response_id {rid!r} is not known here", param="previous_response_id")
        return list(self.items[rid])

    def put(self, rid: str, messages: list[dict]) -> None:
        self.items[rid] = messages
        while len(self.items) > self.size:
            self.items.popitem(last=False)


async def handle(
    request: web.Request, req: ResponsesReq, store: Store, complete: Callable[[ChatReq], Awaitable[dict]]
) -> web.StreamResponse:
    """The whole route: translate, complete (non-streamed chat), remember, answer (JSON or events)."""
    chat_req, messages = to_chat(req, store.get(req.previous_response_id))
    chat = await complete(chat_req)
    rid = f"resp_{uuid.uuid4().hex}"
    body = to_response(req, chat, rid)
    msg = chat["choices"][0]["message"]
    returned = {"role": "assistant", "content": msg.get("content")}
    if msg.get("tool_calls"):
        returned["tool_calls"] = msg["tool_calls"]
    store.put(rid, messages + [returned])
    if not req.stream:
        return web.json_response(body)
    return await stream(request, body)


async def stream(request: web.Request, body: dict) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    seq = 0

    async def send(kind: str, **fields) -> None:
        nonlocal seq
        event = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        await resp.write(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())

    start = {**body, "status": "in_progress", "output": [], "usage": None}
    await send("response.created", response=start)
    await send("response.in_progress", response=start)
    for i, item in enumerate(body["output"]):
        opened = {**item, "status": "in_progress"}
        if item["type"] == "message":
            opened["content"] = []
        if item["type"] == "function_call":
            opened["arguments"] = ""
        await send("response.output_item.added", output_index=i, item=opened)
        if item["type"] == "message":
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": i, "content_index": 0}
            await send("response.content_part.added", **common, part={**part, "text": ""})
            lp = part.get("logprobs", [])
            await send("response.output_text.delta", **common, delta=part["text"], logprobs=lp)
            await send("response.output_text.done", **common, text=part["text"], logprobs=lp)
            await send("response.content_part.done", **common, part=part)
        else:
            common = {"item_id": item["id"], "output_index": i}
            await send("response.function_call_arguments.delta", **common, delta=item["arguments"])
            await send(
                "response.function_call_arguments.done",
                **common,
                arguments=item["arguments"],
                name=item["name"],
            )
        await send("response.output_item.done", output_index=i, item=item)
    done = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    await send(done, response=body)
    await resp.write_eof()
    return resp
