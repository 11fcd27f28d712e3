"""OpenAI-compatible routes: GET /v1/models, POST /v1/completions and /v1/chat/completions.

What the official `openai` client and agents written against it use:
- chat: `tools` / `tool_choice` with `tool_calls` parsed from the output by the server's tool-call
  parser (`--tool-parser`, tool_parsers.py; unparseable output stays plain text), `reasoning_content`
  split off by the reasoning parser (`--reasoning-parser`, reasoning.py), `tool` messages
  with `tool_call_id`, `null` content with tool calls, text content-part arrays, `developer` (as
  system) and `name`; `n > 1`; SSE streaming (`stream=True`, `stream_options.include_usage`);
  `logprobs` with `top_logprobs` (chat) or `logprobs=N` (completions): the top-N of the
  distribution the engine sampled from (sampling.py).
- unknown fields are ignored with one warning per field name; errors have OpenAI's body
  (`error.message/type/param/code`); an unknown `model` is a 404.
- vLLM's `return_tokens_as_token_ids` makes tokens read "token_id:N" (how `VLLMClient` gets ids back
  without re-tokenizing). The text drops a matched stop string unless `include_stop_str_in_output`.
- structured outputs (`response_format` json_schema / json_object, `tool_choice` "required" or a named
  function, `parallel_tool_calls`, `strict` tools) are enforced by grammar-constrained sampling
  (agent_rl/openai/structured.py -> embedded/constrained.py).
Not supported: non-text content parts, penalties, logit_bias.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from agent_rl.engines.api import SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.scheduler import Output
from agent_rl.engines.embedded.web import ENGINE, MODEL_PATH, trim_stop
from agent_rl.openai import anthropic_reply, chat, responses, structured
from agent_rl.openai.errors import Invalid, NotFound, as_error, parse
from agent_rl.openai.protocol import ChatReq, CompletionReq, OpenAISampling, warn_unknown
from agent_rl.openai.reasoning import ReasoningParser, get_reasoning_parser
from agent_rl.openai.tool_parsers import ParsedOutput, get_parser

log = logging.getLogger(__name__)
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
SERVED_NAME = web.AppKey("served_model_name", str)
TOOL_PARSER = web.AppKey("tool_parser", str)
RESPONSES = web.AppKey("responses", responses.Store)
REASONING_PARSER = web.AppKey("reasoning_parser", str)


def model_names(app: web.Application) -> set[str]:
    path = app[MODEL_PATH]
    return {path, Path(path).name, app.get(SERVED_NAME) or path}


def check_model(request: web.Request, req: OpenAISampling) -> str:
    """The model name to answer with; a name this server does not serve is a 404, as OpenAI answers."""
    served = request.app.get(SERVED_NAME) or request.app[MODEL_PATH]
    if req.model is not None and req.model not in model_names(request.app):
        raise NotFound(
            f"model {req.model!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )
    return req.model or served


async def models(request: web.Request) -> web.Response:
    name = request.app.get(SERVED_NAME) or request.app[MODEL_PATH]
    if anthropic_reply.is_anthropic(request):  # an Anthropic client: its list's shape
        return web.json_response(anthropic_reply.models_list(name))
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agent-rl"}]}
    )


async def completions(request: web.Request) -> web.StreamResponse:
    req = await parse(request, CompletionReq)
    warn_unknown(req, "/v1/completions")
    model = check_model(request, req)
    engine = request.app[ENGINE]
    tok = engine.scheduler.tokenizer
    if isinstance(req.prompt, list):
        ids = req.prompt
    elif tok is None:
        raise Invalid(f"{request.app[MODEL_PATH]} has no tokenizer files: send token ids, not text")
    else:
        ids = tok(req.prompt)["input_ids"]
    chat.check_context(len(ids), engine.scheduler.max_seq_len, param="prompt")
    rid = f"cmpl-{uuid.uuid4().hex}"
    top_n = req.logprobs or 0
    if req.stream:
        return await _stream(
            request, req, engine, ids, rid, model, "text_completion", None, DEFAULT_COMPLETION_TOKENS
        )
    outs = await _generate_n(engine, ids, req, rid, DEFAULT_COMPLETION_TOKENS, top_n)
    choices = []
    for i, out in enumerate(outs):
        g = out.generation
        text = "" if tok is None else tok.decode(g.token_ids, skip_special_tokens=req.skip_special_tokens)
        choices.append(
            {
                "index": i,
                "text": trim_stop(text, out, req.include_stop_str_in_output),
                "logprobs": None if req.logprobs is None else _completion_logprobs(tok, out, req),
                "finish_reason": g.finish_reason,
                "stop_reason": out.matched,
            }
        )
    body = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": chat.usage(outs[0].prompt_tokens, sum(len(o.generation.token_ids) for o in outs)),
    }
    return web.json_response(body)


def _completion_logprobs(tok, out: Output, req: CompletionReq) -> dict:
    g = out.generation
    pieces = [chat.token_piece(tok, t, req.return_tokens_as_token_ids) for t in g.token_ids]
    offsets, at = [], 0
    for p in pieces:
        offsets.append(at)
        at += len(p)
    tops = None
    if req.logprobs:
        tops = [
            {chat.token_piece(tok, t, req.return_tokens_as_token_ids): lp for t, lp in top}
            for top in (out.top_logprobs or [])
        ]
    return {"tokens": pieces, "token_logprobs": g.logprobs, "top_logprobs": tops, "text_offset": offsets}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = await parse(request, ChatReq)
    warn_unknown(req, "/v1/chat/completions")
    return await _chat(request, req)


async def responses_route(request: web.Request) -> web.StreamResponse:
    """OpenAI's Responses API, translated to and from chat (agent_rl/openai/responses.py)."""
    req = await parse(request, responses.ResponsesReq)
    warn_unknown(req, "/v1/responses")
    return await responses.handle(
        request, req, request.app[RESPONSES], lambda c: _chat(request, c, as_dict=True)
    )


async def messages_route(request: web.Request) -> web.StreamResponse:
    """Anthropic's Messages API, converted to and from chat (agent_rl/openai/anthropic.py, anthropic_reply.py)."""
    where = f"{request.method} {request.path}"
    return await anthropic_reply.handle_messages(
        request,
        request.app[ENGINE].scheduler.max_seq_len,
        lambda c: _chat(request, c, as_dict=True),
        lambda e: as_error(e, where),
    )


async def count_tokens_route(request: web.Request) -> web.Response:
    """The prompt's token count of a Messages request, rendered as /v1/messages renders it."""
    where = f"{request.method} {request.path}"
    engine = request.app[ENGINE]

    def count(c: ChatReq) -> int:
        check_model(request, c)
        tok = engine.scheduler.tokenizer
        if tok is None:
            raise Invalid(f"{request.app[MODEL_PATH]} has no tokenizer files: chat needs a chat template")
        messages, tools = chat.template_messages(c.messages), chat.template_tools(c.tools)
        return len(chat.render(tok, messages, tools, template_kwargs=c.chat_template_kwargs))

    return await anthropic_reply.handle_count_tokens(
        request, engine.scheduler.max_seq_len, count, lambda e: as_error(e, where)
    )


async def _chat(request: web.Request, req: ChatReq, as_dict: bool = False):
    model = check_model(request, req)
    engine = request.app[ENGINE]
    tok = engine.scheduler.tokenizer
    if tok is None:
        raise Invalid(f"{request.app[MODEL_PATH]} has no tokenizer files: chat needs a chat template")
    ids = chat.render(
        tok,
        chat.template_messages(req.messages),
        chat.template_tools(req.tools),
        add_generation_prompt=req.add_generation_prompt,
        template_kwargs=req.chat_template_kwargs,
    )
    chat.check_context(len(ids), engine.scheduler.max_seq_len)
    parser_name = request.app.get(TOOL_PARSER) or "hermes"
    structure = structured.for_chat(req, parser_name)
    parser = get_parser(parser_name) if req.parse_tools else None
    reasoning = get_reasoning_parser(request.app.get(REASONING_PARSER))
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    max_tokens = engine.scheduler.max_seq_len
    if req.stream:
        return await _stream(
            request,
            req,
            engine,
            ids,
            rid,
            model,
            "chat.completion.chunk",
            parser,
            max_tokens,
            structure,
            reasoning,
        )
    top_n = (req.top_logprobs or 0) if req.logprobs else 0
    outs = await _generate_n(engine, ids, req, rid, max_tokens, top_n, structure)
    choices = []
    for i, out in enumerate(outs):
        g = out.generation
        text = trim_stop(
            tok.decode(g.token_ids, skip_special_tokens=req.skip_special_tokens),
            out,
            req.include_stop_str_in_output or out.matched in structure.stop,
        )
        lps = None
        if req.logprobs:
            lps = chat.logprob_content(
                tok, g.token_ids, g.logprobs, out.top_logprobs, as_ids=req.return_tokens_as_token_ids
            )
        choices.append(chat.choice(i, text, g.finish_reason, parser, lps, out.matched, reasoning))
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": chat.usage(outs[0].prompt_tokens, sum(len(o.generation.token_ids) for o in outs)),
    }
    return body if as_dict else web.json_response(body)


def params(
    req: OpenAISampling, max_tokens: int, i: int, structure: structured.Structure | None
) -> SamplingParams:
    """Choice i's sampling, with the constraint and extra stop strings of the request's structured output."""
    p = req.to_params(max_tokens, i)
    if structure is None:
        return p
    return replace(p, constraint=structure.constraint, stop=p.stop + structure.stop)


async def _generate_n(
    engine: EmbeddedEngine,
    ids: list[int],
    req: OpenAISampling,
    rid: str,
    max_tokens: int,
    top_n: int,
    structure: structured.Structure | None = None,
) -> list[Output]:
    """The n choices run concurrently as separate requests (seed + i each when a seed is given)."""
    return await asyncio.gather(
        *(
            engine.generate_full(
                ids,
                params(req, max_tokens, i, structure),
                request_id=f"{rid}-{i}" if req.n > 1 else rid,
                top_logprobs=top_n,
            )
            for i in range(req.n)
        )
    )


class _Delta:
    """Incremental text of one streamed choice: decoded so far, what was sent, held back near stop strings."""

    def __init__(self, tok, req: OpenAISampling, hold_all: bool):
        self.tok, self.req, self.hold_all = tok, req, hold_all
        self.ids: list[int] = []
        self.sent = ""
        self.hold = max((len(s) for s in chat_stops(req)), default=0)

    def push(self, token: int) -> str:
        self.ids.append(token)
        if self.hold_all:
            return ""
        text = self.tok.decode(self.ids, skip_special_tokens=self.req.skip_special_tokens)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        upto = max(len(self.sent), len(text) - self.hold)
        delta, self.sent = text[len(self.sent) : upto], text[:upto]
        return delta

    def finish(self, out: Output, keep: tuple[str, ...] = ()) -> str:
        text = self.tok.decode(out.generation.token_ids, skip_special_tokens=self.req.skip_special_tokens)
        text = trim_stop(text, out, self.req.include_stop_str_in_output or out.matched in keep)
        return text[len(self.sent) :] if text.startswith(self.sent) else ""


def chat_stops(req: OpenAISampling) -> list[str]:
    return [] if req.stop is None else [req.stop] if isinstance(req.stop, str) else list(req.stop)


async def _stream(
    request: web.Request,
    req: ChatReq | CompletionReq,
    engine: EmbeddedEngine,
    ids: list[int],
    rid: str,
    model: str,
    obj: str,
    parser: Callable[[str], ParsedOutput] | None,
    max_tokens: int,
    structure: structured.Structure | None = None,
    reasoning: ReasoningParser | None = None,
) -> web.StreamResponse:
    """Server-sent events: a chunk per sampled token and choice, then each choice's finish, usage, [DONE].

    With tool or reasoning parsing on, a choice's text is held back and sent whole with its parsed tool
    calls and reasoning at the end (the parse needs the complete output)."""
    whole = parser is not None or reasoning is not None
    is_chat = isinstance(req, ChatReq)
    tok = engine.scheduler.tokenizer
    top_n = 0
    if is_chat and req.logprobs:
        top_n = req.top_logprobs or 0
    elif not is_chat and req.logprobs:
        top_n = req.logprobs
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    created = int(time.time())
    queue: asyncio.Queue = asyncio.Queue()
    deltas = [_Delta(tok, req, hold_all=whole) for _ in range(req.n)]

    async def send(choices: list[dict], usage: dict | None = None) -> None:
        body = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        await resp.write(f"data: {json.dumps(body)}\n\n".encode())

    def run(i: int):
        def on_token(t: int, lp: float, v: int, top) -> None:
            queue.put_nowait(("token", i, t, lp, top))

        async def go() -> None:
            try:
                out = await engine.generate_full(
                    ids,
                    params(req, max_tokens, i, structure),
                    request_id=f"{rid}-{i}" if req.n > 1 else rid,
                    top_logprobs=top_n,
                    on_token=on_token,
                )
                queue.put_nowait(("done", i, out))
            except Exception as e:  # reported in the stream: the status line was already sent
                queue.put_nowait(("error", i, e))

        return asyncio.create_task(go())

    tasks = [run(i) for i in range(req.n)]
    outs: list[Output | None] = [None] * req.n
    # The status line goes out only once the engine took the request (or sampled): a request it refuses
    # (a prompt longer than the context, bad ids) is a 400 with OpenAI's body, as unstreamed.
    first = await queue.get()
    if first[0] == "error":
        for t in tasks:
            t.cancel()
        raise first[2]
    await resp.prepare(request)
    if is_chat:
        await send(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                for i in range(req.n)
            ]
        )
    try:
        while any(o is None for o in outs):
            item, first = (first, None) if first is not None else (await queue.get(), None)
            if item[0] == "error":
                err = {
                    "message": f"{request.path}: {item[2]}",
                    "type": "server_error",
                    "param": None,
                    "code": 500,
                }
                await resp.write(f"data: {json.dumps({'error': err})}\n\n".encode())
                break
            if item[0] == "token":
                _, i, t, lp, top = item
                text = deltas[i].push(t)
                if whole and not (req.logprobs and is_chat):
                    continue
                lps = _stream_logprobs(tok, req, is_chat, t, lp, top)
                if is_chat:
                    await send(
                        [
                            {
                                "index": i,
                                "delta": {"content": text} if text else {},
                                "logprobs": lps,
                                "finish_reason": None,
                            }
                        ]
                    )
                else:
                    await send([{"index": i, "text": text, "logprobs": lps, "finish_reason": None}])
                continue
            _, i, out = item
            outs[i] = out
            rest = deltas[i].finish(out, structure.stop if structure is not None else ())
            finish = out.generation.finish_reason
            if is_chat:
                delta: dict = {}
                if whole:
                    msg, has_calls = chat.message(rest, parser, reasoning, finish)
                    delta = {k: msg[k] for k in ("reasoning_content", "content") if k in msg}
                    if has_calls:
                        delta["tool_calls"] = [dict(c, index=k) for k, c in enumerate(msg["tool_calls"])]
                        finish = "tool_calls" if finish == "stop" else finish
                elif rest:
                    delta = {"content": rest}
                await send([{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}])
            else:
                await send([{"index": i, "text": rest, "logprobs": None, "finish_reason": finish}])
        else:
            opts = req.stream_options
            if opts is not None and opts.include_usage:
                done = [o for o in outs if o is not None]
                await send(
                    [], chat.usage(done[0].prompt_tokens, sum(len(o.generation.token_ids) for o in done))
                )
            await resp.write(b"data: [DONE]\n\n")
    finally:
        for t in tasks:
            t.cancel()  # a client that went away: the engine aborts the request and frees its slot
    await resp.write_eof()
    return resp


def _stream_logprobs(tok, req, is_chat: bool, t: int, lp: float, top) -> dict | None:
    if not req.logprobs:
        return None
    as_ids = req.return_tokens_as_token_ids
    if is_chat:
        return {
            "content": chat.logprob_content(tok, [t], [lp], None if top is None else [top], as_ids=as_ids)
        }
    piece = chat.token_piece(tok, t, as_ids)
    tops = None if top is None else [{chat.token_piece(tok, a, as_ids): alp for a, alp in top}]
    return {"tokens": [piece], "token_logprobs": [lp], "top_logprobs": tops, "text_offset": [0]}


def add_openai_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/responses", responses_route)
    app.router.add_post("/v1/messages", messages_route)
    app.router.add_post("/v1/messages/count_tokens", count_tokens_route)
    app[RESPONSES] = responses.Store()
