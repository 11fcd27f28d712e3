"""HTTP service over a sandbox pool (aiohttp).

Endpoints:
  POST /run_code              SandboxFusion-compatible (verl's sandbox tool can call it)
  POST /v1/run                native: {code, stdin, files, limits} -> ExecResult fields
  POST /v1/sessions           open a stateful session -> {"session": id}
  POST /v1/sessions/{id}/run  run a cell in it;  DELETE /v1/sessions/{id} closes it
  GET  /health                200 {"status": "ok"} once a call has succeeded
  GET  /metrics               Prometheus text: pool counters

Every request but GET /health must carry the service's key as `Authorization: Bearer KEY` (sandboxes/auth.py:
`--api-key` or $AGENT_RL_API_KEY), else 401. Request bodies are read in full before a sandbox is taken, and the response is written after
it is given back, so a slow client never holds a sandbox.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
from typing import Any

from aiohttp import web

from sandboxes.api import ExecResult, Limits, Sandbox, SandboxError, Session
from sandboxes.auth import aiohttp_key_check, env_key

MAX_BODY_BYTES = 32 << 20
_LIMIT_FIELDS = {f.name for f in dataclasses.fields(Limits)}


class BadRequest(ValueError):
    """A request we refuse with 400 and this message."""


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"{request.method} {request.path}: body is not valid JSON ({e})") from e
    if not isinstance(body, dict):
        raise BadRequest(
            f"{request.method} {request.path}: body must be a JSON object, got {type(body).__name__}"
        )
    return body


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(k.__name__ for k in kinds)
        raise BadRequest(f"field {name!r}: expected {expected}, got {type(value).__name__} {value!r:.80}")
    return value


MAX_SECONDS = 24 * 3600.0  # a call's wall-clock and CPU limits: a day at most (RLIMIT_CPU takes an int)
MAX_BYTES = 2**50  # memory, file and output limits: 1 PiB at most (setrlimit's argument is a C long)


def _checked(limits: Limits, field: str) -> Limits:
    """`limits` when every value is finite and within what the kernel's limits can hold; else a 400 naming it."""
    for name, value in dataclasses.asdict(limits).items():
        if value is None:
            continue
        cap = MAX_SECONDS if name in ("timeout_s", "cpu_s") else MAX_BYTES
        if not (value == value and value <= cap):  # NaN, inf, or past what setrlimit and the clock accept
            raise BadRequest(f"field {field!r}: {name}={value!r} is out of range (at most {cap:g})")
    return limits


def _limits(raw: Any, default: Limits) -> Limits:
    if raw is None:
        return default
    if not isinstance(raw, dict) or set(raw) - _LIMIT_FIELDS:
        raise BadRequest(
            f"field 'limits': expected an object with keys from {sorted(_LIMIT_FIELDS)}, got {raw!r:.200}"
        )
    try:
        return _checked(dataclasses.replace(default, **raw), "limits")
    except (TypeError, ValueError) as e:
        raise BadRequest(f"field 'limits': {e}") from e


def _files(raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(
            f"field 'files': expected an object name -> base64 content, got {type(raw).__name__}"
        )
    try:
        return {str(k): base64.b64decode(v, validate=True) for k, v in raw.items()}
    except (ValueError, TypeError) as e:
        raise BadRequest(f"field 'files': content must be base64 strings ({e})") from e


def _fusion_response(result: ExecResult) -> dict[str, Any]:
    """SandboxFusion's RunCodeResponse shape."""
    if result.timed_out:
        run_status = "TimeLimitExceeded"
    elif result.exit_code == 0:
        run_status = "Finished"
    else:
        run_status = "Error"
    return {
        "status": "Success" if run_status == "Finished" else "Failed",
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": result.duration_s,
            "return_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "executor_pod_name": None,
        "files": {},
    }


class SandboxService:
    def __init__(self, sandbox: Sandbox, default_limits: Limits | None = None, *, api_key: str | None = None):
        """api_key: required of every request but GET /health (default: $AGENT_RL_API_KEY; none: open)."""
        self.sandbox = sandbox
        self.api_key = api_key or env_key()
        self.default_limits = default_limits or Limits()
        self.sessions: dict[str, Session] = {}
        self._ids = itertools.count(1)
        self.requests = 0
        self.bad_requests = 0
        self.sandbox_errors = 0

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[aiohttp_key_check(self.api_key), self._errors]
        )
        app.router.add_post("/run_code", self.run_code)
        app.router.add_post("/v1/run", self.run_native)
        app.router.add_post("/v1/sessions", self.open_session)
        app.router.add_post("/v1/sessions/{sid}/run", self.run_session)
        app.router.add_delete("/v1/sessions/{sid}", self.close_session)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.on_cleanup.append(self._cleanup)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests += 1
        try:
            return await handler(request)
        except BadRequest as e:
            self.bad_requests += 1
            return web.json_response({"status": "Failed", "message": str(e)}, status=400)
        except ValueError as e:  # from the sandbox API's own checks (file paths, limits)
            self.bad_requests += 1
            return web.json_response({"status": "Failed", "message": str(e)}, status=400)
        except SandboxError as e:  # the pool's own failure (a hung worker): the client raises it as such
            self.sandbox_errors += 1
            return web.json_response({"status": "SandboxError", "message": str(e)}, status=503)

    async def run_code(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        language = _field(body, "language", str, "python")
        if language != "python":
            raise BadRequest(f"field 'language': only 'python' is supported, got {language!r}")
        code = _field(body, "code", str)
        if code is None:
            raise BadRequest("field 'code' is required")
        timeout = _field(body, "run_timeout", (int, float), self.default_limits.timeout_s)
        memory_mb = _field(body, "memory_limit_MB", (int, float))
        if (
            not 0 < timeout <= MAX_SECONDS
        ):  # also NaN and inf (JSON's Infinity): a wall clock cannot wait that long
            raise BadRequest(
                f"field 'run_timeout': {timeout!r} is out of range (0 < run_timeout <= {MAX_SECONDS:g})"
            )
        limits = dataclasses.replace(self.default_limits, timeout_s=float(timeout))
        if memory_mb is not None:
            if not 0 < memory_mb <= MAX_BYTES >> 20:
                raise BadRequest(
                    f"field 'memory_limit_MB': {memory_mb!r} is out of range (0 < MB <= {MAX_BYTES >> 20})"
                )
            limits = dataclasses.replace(limits, memory_bytes=int(memory_mb * (1 << 20)))
        result = await self.sandbox.run(
            code, limits=limits, stdin=_field(body, "stdin", str), files=_files(body.get("files"))
        )
        return web.json_response(_fusion_response(result))

    async def run_native(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        code = _field(body, "code", str)
        if code is None:
            raise BadRequest("field 'code' is required")
        result = await self.sandbox.run(
            code,
            limits=_limits(body.get("limits"), self.default_limits),
            stdin=_field(body, "stdin", str),
            files=_files(body.get("files")),
        )
        return web.json_response(dataclasses.asdict(result))

    async def open_session(self, request: web.Request) -> web.Response:
        body = await _json_body(request) if request.can_read_body else {}
        sid = str(next(self._ids))
        self.sessions[sid] = self.sandbox.session(limits=_limits(body.get("limits"), self.default_limits))
        return web.json_response({"session": sid})

    def _session(self, request: web.Request) -> tuple[str, Session]:
        sid = request.match_info["sid"]
        if sid not in self.sessions:
            raise web.HTTPNotFound(
                text=json.dumps({"message": f"no session {sid!r}"}), content_type="application/json"
            )
        return sid, self.sessions[sid]

    async def run_session(self, request: web.Request) -> web.Response:
        _, session = self._session(request)
        body = await _json_body(request)
        code = _field(body, "code", str)
        if code is None:
            raise BadRequest("field 'code' is required")
        limits = _limits(body.get("limits"), self.default_limits)
        return web.json_response(dataclasses.asdict(await session.run(code, limits=limits)))

    async def close_session(self, request: web.Request) -> web.Response:
        sid, session = self._session(request)
        del self.sessions[sid]
        await session.close()
        return web.json_response({})

    async def health(self, request: web.Request) -> web.Response:
        result = await self.sandbox.run("print('ok')", limits=Limits(timeout_s=10))
        if result.stdout != "ok\n":
            return web.json_response(
                {"status": "unhealthy", "detail": dataclasses.asdict(result)}, status=503
            )
        return web.json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [f"agent_rl_sandbox_http_requests_total {self.requests}"]
        lines.append(f"agent_rl_sandbox_http_bad_requests_total {self.bad_requests}")
        lines.append(f"agent_rl_sandbox_http_sandbox_errors_total {self.sandbox_errors}")
        lines.append(f"agent_rl_sandbox_open_sessions {len(self.sessions)}")
        stats = getattr(self.sandbox, "stats", None)
        if stats is not None:
            for key, value in dataclasses.asdict(stats).items():
                lines.append(f"agent_rl_sandbox_pool_{key} {value}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _cleanup(self, app: web.Application) -> None:
        for session in list(self.sessions.values()):
            await session.close()
        self.sessions.clear()
        await self.sandbox.close()
