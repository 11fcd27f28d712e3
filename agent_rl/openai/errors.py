"""HTTP error replies in OpenAI's body and strict request parsing, shared by `agent-rl serve`, the gateway and the
embedded engine's native routes.

A reply is a 4xx only when the request was recognised as wrong where it is validated: a `ClientError`
(`Invalid` 400, `NotFound` 404) raised by request parsing (`parse`, `validate`: malformed JSON, a body that
does not fit its model) or by a check on the request's values, or the engine's own `BadRequest` (a prompt
longer than the context, a constraint that does not compile). Anything else that escapes a handler is a bug or
a failure of the server: a 500 with OpenAI's body whose message names the exception, and its traceback in the
server log (`agent_rl.openai.errors`). A ValueError or KeyError from deep inside the server is never taken for
the client's mistake.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from agent_rl.engines.api import BadRequest

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


class ClientError(Exception):
    """A request recognised as wrong; answered with `status` and OpenAI's `param`/`code`."""

    status = 400

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class Invalid(ClientError, ValueError):
    """A client mistake answered with 400 (a template that refuses the messages, a prompt longer than the
    context, a body that does not parse, an option with a value we cannot honour)."""


class NotFound(ClientError, LookupError):
    """Answered with 404 (e.g. an unknown model or session); `param` names the field."""

    status = 404


def error_body(status: int, message: str, *, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}} (SGLang clients read message)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return {
        "error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}
    }


def error(
    status: int, message: str, *, param: str | None = None, code: str | int | None = None
) -> web.Response:
    return web.json_response(error_body(status, message, param=param, code=code), status=status)


def client_error(e: BaseException, where: str) -> tuple[int, dict] | None:
    """(status, OpenAI error body) when `e` is a recognised client mistake; None for anything else (a 500)."""
    if isinstance(e, ClientError):
        return e.status, error_body(e.status, f"{where}: {e}", param=e.param, code=e.code)
    if isinstance(e, BadRequest):  # the engine refused the request itself (too long, bad ids, bad grammar)
        return 400, error_body(400, f"{where}: {e}")
    return None


def server_error(e: BaseException, where: str) -> tuple[int, dict]:
    """A 500 for an exception that is no client mistake; its traceback goes to the server log."""
    log.error("%s: internal error", where, exc_info=e)
    message = f"{where}: internal server error: {type(e).__name__}: {e} (the traceback is in the server log)"
    return 500, error_body(500, message)


def as_error(e: BaseException, where: str) -> tuple[int, dict]:
    """The reply to a request that raised `e`: its 4xx when recognised as the client's mistake, else a logged 500."""
    return client_error(e, where) or server_error(e, where)


@web.middleware
async def errors_to_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:
        status, body = as_error(e, f"{request.method} {request.path}")
        return web.json_response(body, status=status)


def one_line(e: ValidationError) -> str:
    """`field: message (got value)` per error, joined with '; ' (pydantic's own text spans several lines)."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        got = repr(err.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        parts.append(f"{loc}: {err['msg']} (got {got})")
    return f"{e.title}: " + "; ".join(parts)


def validate(model: type[M], data: Any) -> M:
    """`model` from a request's data; a body that does not fit is `Invalid`, naming the first field at fault."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        cause = (errs[0].get("ctx") or {}).get("error") if errs else None
        if isinstance(cause, ClientError):  # raised by a model validator: it names the field itself
            raise cause from None
        param = ".".join(str(x) for x in errs[0]["loc"]) if errs and errs[0]["loc"] else None
        raise Invalid(one_line(e), param=param) from None


async def parse(request: web.Request, model: type[M]) -> M:
    return parse_body(await request.read(), model)


def parse_body(raw: bytes, model: type[M]) -> M:
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Invalid(f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise Invalid(f"request body must be a JSON object, got {type(data).__name__}")
    return validate(model, data)
