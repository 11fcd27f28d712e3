"""The `unsafe-subprocess` backend: the same fork-server, with no isolation at all.

For trusted code and for machines where neither bwrap nor Docker is available. It refuses
to start unless the caller allows it explicitly, because the code runs as this user with
this user's files and network.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile

from sandboxes.api import SandboxError
from sandboxes.local import SANDBOX_ENV, stop_process
from sandboxes.worker import FORKSERVER_PATH, Transport, Worker

ALLOW_ENV = "AGENT_RL_ALLOW_UNSAFE_SANDBOX"


def check_allowed(allow_unsafe: bool) -> None:
    if not (allow_unsafe or os.environ.get(ALLOW_ENV) == "1"):
        raise SandboxError(
            "the 'unsafe-subprocess' sandbox runs code with NO isolation (your user, your files, your "
            f"network); it refuses to start unless you pass allow_unsafe=True or set {ALLOW_ENV}=1. "
            "Use backend 'local' (bubblewrap) or 'docker' for untrusted code."
        )


async def launch_unsafe(python: str = sys.executable, startup_timeout_s: float = 30.0) -> Worker:
    """Start a fork-server as a plain child process working in a private temp dir."""
    workdir = tempfile.mkdtemp(prefix="agent-rl-unsafe-")
    env = {**SANDBOX_ENV, "HOME": workdir, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = await asyncio.create_subprocess_exec(
        python,
        "-I",
        "-B",
        str(FORKSERVER_PATH),
        "--workdir",
        workdir,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
        cwd=workdir,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def kill() -> None:
        await stop_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)

    worker = Worker(Transport(proc.stdout, proc.stdin, kill, f"unsafe-subprocess[pid {proc.pid}]"))
    await worker.handshake(startup_timeout_s)
    return worker
