"""HTTP error replies in OpenAI's body and strict request parsing, shared by `agent-rl serve` and the gateway."""

from __future__ import annotations

import json
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from agent_rl.engines.api import EngineError

M = TypeVar("M", bound=BaseModel)


class Invalid(ValueError):
    """A client mistake answered with 400 and OpenAI's `param`/`code` (a template that refuses the messages,
    a prompt longer than the context, an option with a value we cannot honour)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class NotFound(LookupError):
    """Answered with 404 (e.g. an unknown model); `param` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def error(
    status: int, message: str, *, param: str | None = None, code: str | int | None = None
) -> web.Response:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}} (SGLang clients read message)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    body = {"message": message, "type": kind, "param": param, "code": status if code is None else code}
    return web.json_response({"error": body}, status=status)


@web.middleware
async def errors_to_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except json.JSONDecodeError as e:
        return error(400, f"{request.method} {request.path}: malformed JSON body: {e}")
    except NotFound as e:
        return error(404, f"{request.method} {request.path}: {e}", param=e.param, code=e.code)
    except ValidationError as e:
        errs = e.errors()
        param = ".".join(str(x) for x in errs[0]["loc"]) if errs and errs[0]["loc"] else None
        cause = (errs[0].get("ctx") or {}).get("error") if errs else None
        if isinstance(cause, Invalid):  # raised by a model validator: it names the field itself
            return error(400, f"{request.method} {request.path}: {cause}", param=cause.param, code=cause.code)
        return error(400, f"{request.method} {request.path}: {one_line(e)}", param=param)
    except Invalid as e:
        return error(400, f"{request.method} {request.path}: {e}", param=e.param, code=e.code)
    except (ValueError, KeyError, TypeError) as e:  # BadRequest is a ValueError
        return error(400, f"{request.method} {request.path}: {e}", code=getattr(e, "code", None))
    except EngineError as e:
        return error(500, f"{request.method} {request.path}: {e}")


def one_line(e: ValidationError) -> str:
    """`field: message (got value)` per error, joined with '; ' (pydantic's own text spans several lines)."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        got = repr(err.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        parts.append(f"{loc}: {err['msg']} (got {got})")
    return f"{e.title}: " + "; ".join(parts)


async def parse(request: web.Request, model: type[M]) -> M:
    raw = await request.read()
    data = json.loads(raw) if raw.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"request body must be a JSON object, got {type(data).__name__}")
    return model.model_validate(data)
