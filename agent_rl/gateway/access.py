"""Who may call which gateway route: the control key, an episode's token, the external agents' key.

    access = Access(control_key, external_key)
    token = access.grant(sid)                    # when a session opens: the token its agent is handed
    refusal = access.refusal(method, route, sid, authorization)   # None: let it pass; else (status, body)
    access.revoke(sid)                           # when it closes: the token opens nothing any more

Every request passes `refusal` once, whichever face it comes through: the aiohttp middleware (`middleware`,
installed first on the gateway's app) and the in-process transport (inprocess.py). A route's scope comes from
its path template, so a route added later is guarded by construction:

- `/sessions/{sid}/...` (chat, responses, messages, models, close): the token of session `sid`, or the control key;
- `/tasks/claim`: the external agents' key, or the control key;
- anything else (opening sessions, a path no route matches): the control key only;
- GET /health: open (sandboxes/auth.py OPEN_PATHS).

With no control key the gateway is open (a loopback gateway started without a key; `check_bind` refuses a
routable one). A request without a key, or with one that is no key of this gateway, gets 401; a key of this
gateway presented where its scope does not reach (another session's token, the external key on a session)
gets 403. Tokens are compared as SHA-256 digests: a token's digest is its dictionary key, and the control and
external keys are compared with `secrets.compare_digest`, as sandboxes/auth.py does.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent_rl.openai.errors import error_body
from sandboxes.auth import OPEN_PATHS, unauthorized

SESSION_PREFIX = "/sessions/{sid}/"  # an agent's token reaches these routes of its own session
CLAIM = "/tasks/claim"  # the external agents' key reaches this one


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.strip().encode()).digest()


class Access:
    """The gateway's keys and the live sessions' tokens (session id -> token digest, and back)."""

    def __init__(self, control_key: str | None, external_key: str | None = None):
        if external_key is not None and control_key is not None and external_key == control_key:
            raise ValueError("the external agents' key must differ from the control key")
        self.guarded = bool(control_key)
        self._control = _digest(control_key) if control_key else None
        self._external = _digest(external_key) if external_key else None
        self._sid_of: dict[bytes, str] = {}
        self._token_of: dict[str, bytes] = {}

    def grant(self, sid: str) -> str:
        """A fresh token for session `sid` (which it opens until `revoke`)."""
        self.revoke(sid)
        token = "sess-" + secrets.token_urlsafe(32)
        d = _digest(token)
        self._sid_of[d], self._token_of[sid] = sid, d
        return token

    def revoke(self, sid: str) -> None:
        d = self._token_of.pop(sid, None)
        if d is not None:
            self._sid_of.pop(d, None)

    def refusal(self, method: str, route: str | None, sid: str | None, authorization: str | None,
                path: str = "") -> tuple[int, dict] | None:  # fmt: skip
        """None when the request may pass; else the status and OpenAI's error body. `route`: the matched route's
        path template (`/sessions/{sid}/v1/models`), None when no route matches; `sid`: its session id."""
        if not self.guarded:
            return None
        where = f"{method} {path or route}"
        if method in ("GET", "HEAD") and route in OPEN_PATHS:
            return None
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return 401, unauthorized(
                f"{where}: no API key: send this session's token (the api_key the gateway handed out), or the "
                "gateway's key, as 'Authorization: Bearer KEY'"
            )
        d = _digest(presented)
        if self._control is not None and secrets.compare_digest(d, self._control):
            return None
        external = self._external is not None and secrets.compare_digest(d, self._external)
        owner = self._sid_of.get(d)
        if route is not None and route.startswith(SESSION_PREFIX) and owner is not None and owner == sid:
            return None
        if route == CLAIM and external:
            return None
        if owner is None and not external:
            return 401, unauthorized(f"{where}: wrong API key (no key or live session token of this gateway)")
        what = "a session's token opens only that session's routes" if owner else (
            "the external agents' key opens POST /tasks/claim only; close a task with the session token the claim "
            "answered"
        )  # fmt: skip
        return 403, error_body(403, f"{where}: this key may not call this route ({what})", code="forbidden")


def route_of(request: web.Request) -> tuple[str | None, str | None]:
    """The matched route's path template and its `{sid}` (None, None for a path no route matches)."""
    resource = request.match_info.route.resource
    return (resource.canonical if resource is not None else None), request.match_info.get("sid")


def middleware(access: Access) -> Any:
    """The aiohttp middleware that runs `access.refusal` on every request before its handler reads a byte."""

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        route, sid = route_of(request)
        refused = access.refusal(
            request.method, route, sid, request.headers.get("Authorization"), request.path
        )
        if refused is not None:
            status, body = refused
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            return web.json_response(body, status=status, headers=headers)
        return await handler(request)

    return check
