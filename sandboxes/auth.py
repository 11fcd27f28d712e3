"""Who may call a service the project starts: a bearer key, checked on every request but GET /health.

    app = web.Application(middlewares=[aiohttp_key_check(key)])   # the sandbox service, the engine server,
    asgi_app = asgi_key_check(app, key)                            # the gateway; the MCP tool server (ASGI)
    check_bind(host, key, insecure=False, service="agent-rl sandbox serve")   # refuse a routable bind with no key

Clients send `Authorization: Bearer KEY`, as OpenAI's clients send their api_key and as vLLM and SGLang
check it when started with `--api-key`. The key is the run's (`AGENT_RL_API_KEY`; `agent-rl train`
generates one when it is not set, agent_rl/auth.py) or the one given with `--api-key`. Like vLLM, a
presented key and the service's are compared as SHA-256 digests with `secrets.compare_digest`, so the
time taken says nothing about how much of the key matched. A refusal is 401 with OpenAI's error body
(`invalid_api_key`), which the official clients raise as `AuthenticationError`. GET /health stays open,
as in vLLM and SGLang, so launchers and probes can wait for a service without holding its key.

This lives in sandboxes/ because it is the lowest package that serves HTTP: the servers in agent_rl/
(engine server, gateway) use these same checks (agent_rl may import sandboxes; the reverse is forbidden).
Hand-written rather than a library: aiohttp has no bearer-token middleware, and the check is ten lines.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

KEY_ENV = "AGENT_RL_API_KEY"
OPEN_PATHS = frozenset({"/health"})  # GET/HEAD only; every other request needs the key


def env_key() -> str | None:
    """The key in this process's environment ($AGENT_RL_API_KEY), or None."""
    return os.environ.get(KEY_ENV) or None


def bearer(key: str | None) -> dict[str, str]:
    """The request header that carries `key` (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


class KeyCheck:
    """Compares the Authorization header of a request with the service's key."""

    def __init__(self, key: str):
        if not key:
            raise ValueError("an empty API key protects nothing: give a key, or none")
        self._digest = hashlib.sha256(key.encode()).digest()

    def refusal(self, method: str, path: str, authorization: str | None) -> dict | None:
        """None when the request may pass; else OpenAI's error body saying why it may not."""
        if method in ("GET", "HEAD") and path in OPEN_PATHS:
            return None
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return unauthorized(
                f"{method} {path}: no API key: send the run's key as 'Authorization: Bearer KEY' "
                f"(${KEY_ENV}; an OpenAI client's api_key)"
            )
        if not secrets.compare_digest(hashlib.sha256(presented.strip().encode()).digest(), self._digest):
            return unauthorized(
                f"{method} {path}: wrong API key (not this service's ${KEY_ENV} or --api-key)"
            )
        return None


def unauthorized(message: str) -> dict:
    """OpenAI's 401 body (its code for a bad or missing key is `invalid_api_key`)."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def aiohttp_key_check(key: str | None) -> Any:
    """An aiohttp middleware refusing requests without `key` (401); with no key, one that lets all pass.
    Install it first, so a refused request is answered before any handler reads its body."""
    from aiohttp import web

    check = KeyCheck(key) if key else None

    @web.middleware
    async def require_key(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        if check is not None:
            body = check.refusal(request.method, request.path, request.headers.get("Authorization"))
            if body is not None:
                return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return require_key


def asgi_key_check(app: Any, key: str | None, *, also: Callable[[str, str], bool] | None = None) -> Any:
    """`app` (ASGI) behind the same check; `app` itself when there is no key. `also(path, presented)`: whether a
    key other than `key` opens `path` (the MCP server's per-episode tokens)."""
    if not key:
        return app
    check = KeyCheck(key)

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the server's own start/stop events: no client, no headers
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        # a websocket handshake is checked as its GET (anything but http and lifespan: refused without the key)
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        body = check.refusal(method, scope.get("path", ""), headers.get("authorization"))
        if body is not None and also is not None:
            scheme, _, presented = headers.get("authorization", "").partition(" ")
            if (
                scheme.lower() == "bearer"
                and presented.strip()
                and also(scope.get("path", ""), presented.strip())
            ):
                body = None
        if body is None:
            await app(scope, receive, send)
        elif (
            scope["type"] == "websocket"
        ):  # close before accepting: the server answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
        else:
            payload = json.dumps(body).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                (b"www-authenticate", b"Bearer")]})  # fmt: skip
            await send({"type": "http.response.body", "body": payload})

    return guarded


REDACTED = "***"
_SECRET_FLAG = re.compile(r"(--api[-_]key[= ]|Bearer |api_key=['\"]?)([^\s'\",)]+)", re.IGNORECASE)
SECRET_ENVS = (
    KEY_ENV,
    "AGENT_RL_EXTERNAL_AGENT_KEY",
)  # the run's key, the external agents' (agent_rl/auth.py)


def redact(text: str, secrets_: tuple[str, ...] = ()) -> str:
    """`text` (an error, a log tail, a command line) with every secret replaced by ***: the values of `secrets_`
    and of this process's key variables, and whatever follows `--api-key`, `Bearer ` or `api_key=` (SGLang logs
    its arguments as `api_key='...'`). Every place that prints a command or a server's log goes through it."""
    for value in (*secrets_, *(os.environ.get(k) for k in SECRET_ENVS)):
        if value:
            text = text.replace(value, REDACTED)
    return _SECRET_FLAG.sub(lambda m: m.group(1) + REDACTED, text)


def redact_command(cmd: list[str]) -> str:
    """A command line as one printable string, secrets redacted (`redact`)."""
    return redact(" ".join(cmd))


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


class InsecureBind(ValueError):
    """A service asked to listen beyond this machine with no key."""


def check_bind(host: str, key: str | None, *, insecure: bool, service: str) -> None:
    """Refuse to serve on a routable address without a key (anyone who reaches the port could use it)."""
    if key or insecure or is_loopback(host):
        return
    raise InsecureBind(
        f"{service}: --host {host} is reachable from other machines and no API key is set: set ${KEY_ENV} "
        "(or --api-key KEY; clients then send 'Authorization: Bearer KEY'), bind 127.0.0.1, or pass "
        "--insecure to serve without a key"
    )


def add_key_args(parser: argparse.ArgumentParser) -> None:
    """--api-key and --insecure, as every `agent-rl` server command takes them."""
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every request but GET /health (default: ${KEY_ENV}; "
        "prefer the variable: a command line is visible to every user of the machine)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a non-loopback --host without a key (refused otherwise)",
    )


def key_from_args(args: argparse.Namespace) -> str | None:
    """--api-key, else $AGENT_RL_API_KEY, else None."""
    return args.api_key or env_key()
