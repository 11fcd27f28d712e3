"""The "http" backend: a `Sandbox` whose calls go to a remote `agent-rl sandbox serve`.

Lets rollout workers on many machines share one sandbox fleet. Transport errors raise
`SandboxError` (an infrastructure failure, not a tool result). Every request carries the key as
`Authorization: Bearer KEY` (`api_key`, default $AGENT_RL_API_KEY: a training run's key; sandboxes/auth.py).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from sandboxes.api import ExecResult, Limits, Sandbox, SandboxError, Session, check_files
from sandboxes.auth import bearer, env_key


@dataclass(frozen=True)
class HttpOptions:
    url: str = "http://127.0.0.1:8080"
    """Base URL of the service."""
    extra_timeout_s: float = 30.0
    """Added to each call's own timeout for queueing and transfer."""


class HttpSandbox(Sandbox):
    def __init__(
        self,
        opts: HttpOptions,
        *,
        pool_size: int = 1,
        limits: Limits | None = None,
        api_key: str | None = None,
    ):
        self.opts = opts
        self.headers = bearer(api_key or env_key())  # never an option: options end up in resolved configs
        self.url = opts.url.rstrip("/")
        self.limits = limits or Limits()
        self.pool_size = pool_size
        self._client: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.pool_size), headers=self.headers
            )
        return self._client

    async def start(self) -> None:
        """Check that the service answers /health."""
        try:
            async with self._session().get(
                self.url + "/health", timeout=aiohttp.ClientTimeout(total=30)
            ) as resp:
                if resp.status != 200:
                    raise SandboxError(f"GET {self.url}/health: HTTP {resp.status}: {await resp.text()}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SandboxError(f"GET {self.url}/health failed: {e!r}") from e

    async def post(self, path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=timeout_s + self.opts.extra_timeout_s)
        try:
            async with self._session().post(self.url + path, json=body, timeout=timeout) as resp:
                payload = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise SandboxError(
                        f"POST {self.url}{path}: HTTP {resp.status}: {payload.get('message', payload)}"
                    )
                return payload
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SandboxError(f"POST {self.url}{path} failed: {e!r}") from e

    async def run(
        self,
        code: str,
        *,
        limits: Limits | None = None,
        stdin: str | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        limits = limits or self.limits
        body = {
            "code": code,
            "stdin": stdin,
            "files": {k: base64.b64encode(v).decode() for k, v in check_files(files).items()},
            "limits": dataclasses.asdict(limits),
        }
        return ExecResult.from_wire(await self.post("/v1/run", body, limits.timeout_s))

    def session(self, *, limits: Limits | None = None) -> Session:
        return HttpSession(self, limits or self.limits)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class HttpSession(Session):
    def __init__(self, sandbox: HttpSandbox, limits: Limits):
        self.sandbox = sandbox
        self.limits = limits
        self.sid: str | None = None

    async def run(self, code: str, *, limits: Limits | None = None) -> ExecResult:
        limits = limits or self.limits
        if self.sid is None:
            reply = await self.sandbox.post("/v1/sessions", {"limits": dataclasses.asdict(self.limits)}, 10.0)
            self.sid = reply["session"]
        body = {"code": code, "limits": dataclasses.asdict(limits)}
        return ExecResult.from_wire(
            await self.sandbox.post(f"/v1/sessions/{self.sid}/run", body, limits.timeout_s)
        )

    async def close(self) -> None:
        if self.sid is not None and self.sandbox._client is not None:
            try:
                async with self.sandbox._client.delete(f"{self.sandbox.url}/v1/sessions/{self.sid}"):
                    pass
            except aiohttp.ClientError as e:
                raise SandboxError(f"closing session {self.sid} at {self.sandbox.url} failed: {e!r}") from e
        self.sid = None
