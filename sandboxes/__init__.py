"""Fast, isolated execution of model-written Python code.

    async with sandboxes.create("local", pool_size=4) as sb:
        result = await sb.run("print(1 + 1)", limits=sandboxes.Limits(timeout_s=5))
        async with sb.session() as s:          # variables survive between calls
            await s.run("x = 41")
            print((await s.run("print(x + 1)")).stdout)

Backends: "local" (bubblewrap + fork-server, the default), "docker" (warm containers on a
Docker engine), "http" (a remote `agent-rl sandbox serve`), "unsafe-subprocess" (no isolation;
needs allow_unsafe=True).
"""

from __future__ import annotations

from typing import Any

from sandboxes.api import ExecResult, Limits, Sandbox, SandboxError, Session

BACKENDS = ("local", "docker", "http", "unsafe-subprocess")

__all__ = ["BACKENDS", "ExecResult", "Limits", "Sandbox", "SandboxError", "Session", "create"]


def create(
    backend: str = "local",
    *,
    pool_size: int = 1,
    limits: Limits | None = None,
    max_calls: int = 1000,
    **options: Any,
) -> Sandbox:
    """Make a sandbox. Workers start on the first call (or `await sb.start()` for pooled backends).

    pool_size: concurrent calls served at once (warm sandboxes / containers).
    limits: default `Limits` for calls that pass none.
    max_calls: a worker is replaced after this many calls.
    options: backend-specific, see `LocalOptions`, `DockerOptions`, `HttpOptions`;
      "unsafe-subprocess" takes allow_unsafe=True and python=PATH.
    """
    limits = limits or Limits()
    if backend == "local":
        from sandboxes.local import LocalOptions, check_available, launch_local
        from sandboxes.pool import PooledSandbox

        opts = _build(LocalOptions, options, backend)
        check_available(opts)
        return PooledSandbox(
            lambda: launch_local(opts, limits),
            pool_size=pool_size,
            limits=limits,
            max_calls=max_calls,
            name="local",
        )
    if backend == "unsafe-subprocess":
        from sandboxes.pool import PooledSandbox
        from sandboxes.unsafe import check_allowed, launch_unsafe

        check_allowed(bool(options.pop("allow_unsafe", False)))
        python = options.pop("python", None)
        _reject_unknown(options, backend, ["allow_unsafe", "python"])
        return PooledSandbox(
            (lambda: launch_unsafe(python)) if python else launch_unsafe,
            pool_size=pool_size,
            limits=limits,
            max_calls=max_calls,
            name=backend,
        )
    if backend == "docker":
        from sandboxes.dockerexec import DockerOptions, docker_sandbox

        return docker_sandbox(
            _build(DockerOptions, options, backend), pool_size=pool_size, limits=limits, max_calls=max_calls
        )
    if backend == "http":
        from sandboxes.http_client import HttpOptions, HttpSandbox

        return HttpSandbox(_build(HttpOptions, options, backend), pool_size=pool_size, limits=limits)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def _build(cls: Any, options: dict[str, Any], backend: str) -> Any:
    import dataclasses

    _reject_unknown(options, backend, [f.name for f in dataclasses.fields(cls)])
    return cls(**options)


def _reject_unknown(options: dict[str, Any], backend: str, known: list[str]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"sandbox backend {backend!r}: unknown option(s) {unknown}; known: {sorted(known)}")
