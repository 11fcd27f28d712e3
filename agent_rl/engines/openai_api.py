"""OpenAI-compatible routes: GET /v1/models, POST /v1/completions and /v1/chat/completions (non-streaming).

Enough for the official `openai` client and agents written against it. Log-probs are the sampled
tokens' (see sampling.py for which distribution); `return_tokens_as_token_ids` (vLLM's extension)
makes completion tokens read "token_id:N", which is how `VLLMClient` gets ids back without
re-tokenizing. The text drops a matched stop string unless `include_stop_str_in_output`.
"""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from agent_rl.engines.protocol import ChatReq, CompletionReq
from agent_rl.engines.web_common import ENGINE, MODEL_PATH, parse, tokenizer, trim_stop

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def models(request: web.Request) -> web.Response:
    name = request.app[MODEL_PATH]
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agent-rl"}]}
    )


async def completions(request: web.Request) -> web.Response:
    req = await parse(request, CompletionReq)
    engine = request.app[ENGINE]
    tok = engine.scheduler.tokenizer
    ids = req.prompt if isinstance(req.prompt, list) else tokenizer(request)(req.prompt)["input_ids"]
    rid = f"cmpl-{uuid.uuid4().hex}"
    out = await engine.generate_full(ids, req.to_params(DEFAULT_COMPLETION_TOKENS), request_id=rid)
    g = out.generation
    text = "" if tok is None else tok.decode(g.token_ids, skip_special_tokens=req.skip_special_tokens)
    logprobs = None
    if req.logprobs is not None:
        if req.return_tokens_as_token_ids or tok is None:
            pieces = [f"token_id:{t}" for t in g.token_ids]
        else:
            pieces = [tok.decode([t]) for t in g.token_ids]
        offsets, at = [], 0
        for p in pieces:
            offsets.append(at)
            at += len(p)
        logprobs = {
            "tokens": pieces,
            "token_logprobs": g.logprobs,
            "top_logprobs": None,
            "text_offset": offsets,
        }
    choice = {
        "index": 0,
        "text": trim_stop(text, out, req.include_stop_str_in_output),
        "logprobs": logprobs,
        "finish_reason": g.finish_reason,
        "stop_reason": out.matched,
    }
    body = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model or request.app[MODEL_PATH],
        "choices": [choice],
        "usage": usage(out.prompt_tokens, len(g.token_ids)),
    }
    return web.json_response(body)


async def chat_completions(request: web.Request) -> web.Response:
    req = await parse(request, ChatReq)
    engine = request.app[ENGINE]
    tok = tokenizer(request)
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            f"{request.app[MODEL_PATH]}: the tokenizer has no chat template; use /v1/completions"
        )
    prompt = tok.apply_chat_template(
        [m.model_dump() for m in req.messages],
        add_generation_prompt=req.add_generation_prompt,
        tokenize=False,
    )
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    out = await engine.generate_full(ids, req.to_params(engine.scheduler.max_seq_len), request_id=rid)
    g = out.generation
    text = trim_stop(
        tok.decode(g.token_ids, skip_special_tokens=req.skip_special_tokens),
        out,
        req.include_stop_str_in_output,
    )
    logprobs = None
    if req.logprobs:
        content = []
        for t, lp in zip(g.token_ids, g.logprobs, strict=True):
            piece = f"token_id:{t}" if req.return_tokens_as_token_ids else tok.decode([t])
            content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []})
        logprobs = {"content": content}
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model or request.app[MODEL_PATH],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": g.finish_reason,
                "stop_reason": out.matched,
            }
        ],
        "usage": usage(out.prompt_tokens, len(g.token_ids)),
    }
    return web.json_response(body)


def add_openai_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
