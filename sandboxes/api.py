"""Public types: what a call may use (`Limits`), what it returns (`ExecResult`), and the `Sandbox` API."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, Self

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


class SandboxError(RuntimeError):
    """The sandbox infrastructure failed (not the user's code): a worker died, an engine is missing."""


@dataclass(frozen=True)
class Limits:
    """Per-call resource limits. Defaults suit one model-written Python snippet."""

    timeout_s: float = 10.0
    """Wall-clock limit; the call's processes are killed when it passes."""
    cpu_s: float | None = None
    """CPU-seconds limit (RLIMIT_CPU); None means equal to `timeout_s`."""
    memory_bytes: int = 1 * GiB
    """Address-space limit per process (RLIMIT_AS), and the sandbox's cgroup memory cap."""
    processes: int = 64
    """Processes/threads at once. With a cgroup (local as root, docker) the cap is per sandbox, fixed
    when the sandbox starts from the pool's default limits, and includes its own 2-4 processes;
    otherwise RLIMIT_NPROC per call."""
    file_bytes: int = 16 * MiB
    """Largest file the code may write (RLIMIT_FSIZE)."""
    output_bytes: int = 64 * KiB
    """Bytes of stdout and of stderr kept; the rest is discarded and `truncated` set."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and not value > 0:
                raise ValueError(f"Limits.{field.name} must be > 0, got {value!r}")

    def to_wire(self) -> dict[str, Any]:
        wire = dataclasses.asdict(self)
        wire["cpu_s"] = self.cpu_s if self.cpu_s is not None else self.timeout_s
        return wire


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one call. `exit_code` < 0 means killed by that signal (as in `subprocess`)."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ExecResult:
        return cls(**{f.name: wire[f.name] for f in dataclasses.fields(cls)})


def check_files(files: Mapping[str, str | bytes] | None) -> dict[str, bytes]:
    """Validate `files` (relative path -> content) and return them as bytes."""
    out: dict[str, bytes] = {}
    for name, content in (files or {}).items():
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"files: {name!r} must be a relative path inside the working directory")
        if not isinstance(content, str | bytes):
            raise TypeError(f"files[{name!r}]: expected str or bytes, got {type(content).__name__}")
        out[str(path)] = content.encode() if isinstance(content, str) else content
    return out


class Session(abc.ABC):
    """A stateful Python session for one trajectory: variables survive between `run` calls.

    If a call times out or the session's process dies, the state is lost; the next call starts
    a fresh namespace and its stderr begins with a note saying so.
    """

    @abc.abstractmethod
    async def run(self, code: str, *, limits: Limits | None = None) -> ExecResult: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class Sandbox(abc.ABC):
    """Runs untrusted Python code. Safe to call concurrently from many asyncio tasks."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start workers now rather than on the first call (fails early if the backend is unusable)."""

    @abc.abstractmethod
    async def run(
        self,
        code: str,
        *,
        limits: Limits | None = None,
        stdin: str | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult: ...

    @abc.abstractmethod
    def session(self, *, limits: Limits | None = None) -> Session: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
