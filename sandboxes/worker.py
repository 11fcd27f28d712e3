"""Host side of one fork-server: frames requests to it and reads its replies.

A `Worker` serves one request at a time (its `lock`); the pool decides which worker a call
gets. Backends differ only in how they start the fork-server and what byte streams reach
it (a local bwrap process's pipes, or a Docker exec socket), so they hand us a `Transport`.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes.api import SandboxError

_HEADER = struct.Struct(">I")
FORKSERVER_PATH = Path(__file__).with_name("forkserver.py")
INSIDE_FORKSERVER = "/opt/agent-rl/forkserver.py"
"""Where the fork-server sits inside a local sandbox and inside the docker image."""

# Extra wall time the host grants beyond the call's own timeout before declaring the worker hung.
HOST_GRACE_S = 5.0


@dataclass
class Transport:
    """Byte streams to a started fork-server plus how to destroy it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    kill: Callable[[], Awaitable[None]]
    describe: str


class Worker:
    def __init__(self, transport: Transport):
        self.transport = transport
        self.lock = asyncio.Lock()
        self.calls = 0
        self.sessions: set[int] = set()
        self.alive = True
        self.retiring = False

    async def handshake(self, timeout_s: float) -> dict[str, Any]:
        try:
            hello = await asyncio.wait_for(self._recv(), timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            await self.kill()
            raise SandboxError(f"sandbox {self.transport.describe} did not start: {e!r}") from e
        if not hello.get("ready"):
            await self.kill()
            raise SandboxError(f"sandbox {self.transport.describe} sent {hello!r} instead of ready")
        return hello

    async def request(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for its reply; kills the worker if it dies or hangs."""
        data = json.dumps(msg).encode()
        try:
            self.transport.writer.write(_HEADER.pack(len(data)) + data)
            await self.transport.writer.drain()
            async with asyncio.timeout(timeout_s + HOST_GRACE_S):  # no extra task per call, unlike wait_for
                reply = await self._recv()
        except TimeoutError as e:
            await self.kill()
            raise WorkerHung(
                f"sandbox {self.transport.describe} sent no reply to {msg['op']} within its {timeout_s:g} s "
                f"timeout + {HOST_GRACE_S:g} s; the worker was killed and is being replaced"
            ) from e
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            await self.kill()
            raise WorkerDied(f"sandbox {self.transport.describe} died during {msg['op']}: {e!r}") from e
        if "error" in reply:
            raise SandboxError(f"sandbox {self.transport.describe} failed in {msg['op']}:\n{reply['error']}")
        return reply

    async def _recv(self) -> dict[str, Any]:
        (size,) = _HEADER.unpack(await self.transport.reader.readexactly(_HEADER.size))
        return json.loads(await self.transport.reader.readexactly(size))

    async def kill(self) -> None:
        if self.alive:
            self.alive = False
            await self.transport.kill()


class WorkerDied(SandboxError):
    """The fork-server went away mid-request (killed or crashed)."""


class WorkerHung(SandboxError):
    """The fork-server did not answer within the call's timeout plus a grace period: an infrastructure
    failure (the fork-server enforces the timeout itself), so the caller gets this error, not a result."""
