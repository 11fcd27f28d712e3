"""What both route modules share: app keys, JSON error replies, strict body parsing, text helpers."""

from __future__ import annotations

import json
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from agent_rl.engines.api import EngineError
from agent_rl.engines.embedded import EmbeddedEngine
from agent_rl.engines.scheduler import Output

ENGINE = web.AppKey("engine", EmbeddedEngine)
MODEL_PATH = web.AppKey("model_path", str)
M = TypeVar("M", bound=BaseModel)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


@web.middleware
async def errors_to_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except json.JSONDecodeError as e:
        return error(400, f"{request.method} {request.path}: malformed JSON body: {e}")
    except (ValueError, KeyError, TypeError) as e:  # pydantic ValidationError and BadRequest are ValueErrors
        return error(400, f"{request.method} {request.path}: {e}")
    except EngineError as e:
        return error(500, f"{request.method} {request.path}: {e}")


async def parse(request: web.Request, model: type[M]) -> M:
    raw = await request.read()
    data = json.loads(raw) if raw.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"request body must be a JSON object, got {type(data).__name__}")
    return model.model_validate(data)


def tokenizer(request: web.Request):
    tok = request.app[ENGINE].scheduler.tokenizer
    if tok is None:
        raise ValueError(f"{request.app[MODEL_PATH]} has no tokenizer files: send token ids, not text")
    return tok


def trim_stop(text: str, out: Output, keep: bool) -> str:
    """Drop a matched stop string (and whatever its last token carried after it) from the text, as SGLang does."""
    if keep or not isinstance(out.matched, str):
        return text
    i = text.find(out.matched)
    return text if i < 0 else text[:i]
