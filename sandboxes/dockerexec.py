"""The docker backend: warm containers, each with a fork-server reached over one attached exec stream.

Containers run with no network, a read-only root, tmpfs /tmp, memory+swap, pids and ulimit
caps, uid 65534, all capabilities dropped, no-new-privileges, an init (so zombies do not
eat the pids cap), and our seccomp filter on top of the engine's. They carry labels and
remove themselves when their owner is gone (`sandboxes.docker_engine`). docker-py is
imported lazily; the engine comes from `docker_host` or DOCKER_HOST. The image is built
offline by `sandboxes.image.build_image`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from sandboxes.api import Limits, MiB, SandboxError
from sandboxes.docker_engine import WATCHDOG, Labels, docker_client, owner_id, remove_orphans
from sandboxes.image import image_python
from sandboxes.local import NOBODY, SANDBOX_ENV
from sandboxes.pool import PooledSandbox
from sandboxes.seccomp import filter_bpf
from sandboxes.worker import INSIDE_FORKSERVER, Transport, Worker

DEFAULT_IMAGE = f"agent-rl-sandbox:py{sys.version_info.major}.{sys.version_info.minor}"
_FRAME = struct.Struct(">BxxxL")
_ERR_KEPT = 4000


@dataclass(frozen=True)
class DockerOptions:
    image: str = DEFAULT_IMAGE
    docker_host: str | None = None
    """Engine URL (unix:///path/docker.sock); default: DOCKER_HOST or the standard socket."""
    python: str | None = None
    """Interpreter path inside the image; default: the host base install's path (how build-image lays it out)."""
    tmp_bytes: int = 64 * MiB
    runtime: str | None = None
    """e.g. "runsc" for gVisor."""
    seccomp: bool = True
    """Load the seccomp filter of `sandboxes.seccomp` in each container's fork-server (on top of the engine's)."""
    preload: tuple[str, ...] | list[str] = ()
    """Modules the fork-server imports once (they must be in the image: build-image copies numpy and sympy)."""
    run: str = ""
    """Value of the containers' `agent-rl.run` label (default: the owning process, host:pid:start-time)."""


async def _demux(raw: asyncio.StreamReader, out: asyncio.StreamReader, err: bytearray) -> None:
    """Docker multiplexes stdout/stderr of a non-tty exec into frames: stdout's bytes go to `out`, the last
    `_ERR_KEPT` of stderr's to `err` (what the fork-server said if it dies before its handshake)."""
    try:
        while True:
            kind, size = _FRAME.unpack(await raw.readexactly(_FRAME.size))
            payload = await raw.readexactly(size)
            if kind == 1:
                out.feed_data(payload)
            elif kind == 2:
                err += payload
                del err[:-_ERR_KEPT]
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        out.feed_eof()


async def launch_docker(
    client: Any, opts: DockerOptions, limits: Limits, python: str, labels: Labels
) -> Worker:
    def create() -> tuple[Any, Any]:
        from docker.types import Ulimit

        container = client.containers.run(
            opts.image,
            command=[python, "-I", "-c", WATCHDOG],
            labels=labels.as_dict(),
            detach=True,
            init=True,
            network_mode="none",
            mem_limit=limits.memory_bytes + opts.tmp_bytes + 256 * MiB,
            memswap_limit=limits.memory_bytes + opts.tmp_bytes + 256 * MiB,
            pids_limit=limits.processes + 8,
            ulimits=[Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="core", soft=0, hard=0)],
            read_only=True,
            tmpfs={"/tmp": f"size={opts.tmp_bytes},mode=1777", "/dev/shm": "size=4m,mode=1777"},
            user=f"{NOBODY}:{NOBODY}",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            environment={**SANDBOX_ENV, "PATH": f"{python.rsplit('/', 1)[0]}:/usr/bin:/bin"},
            working_dir="/tmp",
            runtime=opts.runtime,
            auto_remove=True,
        )
        cmd = [python, "-I", "-B", INSIDE_FORKSERVER, "--private-shm", "--workdir", "/tmp"]
        if opts.preload:
            cmd += ["--preload", ",".join(opts.preload)]
        if opts.seccomp:
            cmd += ["--seccomp-bpf", base64.b64encode(filter_bpf()).decode()]
        exec_id = client.api.exec_create(
            container.id, cmd, stdin=True, stdout=True, stderr=True, user=f"{NOBODY}"
        )
        sock = client.api.exec_start(exec_id["Id"], socket=True)
        return container, sock

    try:
        container, sock = await asyncio.to_thread(create)
    except Exception as e:
        raise SandboxError(f"docker backend: cannot start a container from {opts.image!r}: {e}") from e
    raw_sock = sock._sock
    raw_sock.setblocking(False)
    raw_reader, writer = await asyncio.open_connection(sock=raw_sock)
    reader = asyncio.StreamReader(limit=1 << 26)
    stderr = bytearray()
    demux = asyncio.ensure_future(_demux(raw_reader, reader, stderr))

    ready = False
    post_mortem = ""  # what is known of a fork-server killed before its handshake

    async def kill() -> None:
        nonlocal post_mortem
        with contextlib.suppress(OSError):
            writer.close()
        demux.cancel()
        if not ready and not post_mortem:
            post_mortem = await asyncio.to_thread(_post_mortem, container, stderr)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(container.remove, force=True)

    worker = Worker(Transport(reader, writer, kill, f"docker[{container.short_id}]"))
    try:
        hello = await worker.handshake(30.0)
    except SandboxError as e:
        raise SandboxError(f"{e}; {post_mortem}") from e
    ready = True
    if hello.get("seccomp") != opts.seccomp:
        await worker.kill()
        raise SandboxError(
            f"docker backend: fork-server has seccomp={hello.get('seccomp')}, expected {opts.seccomp}"
        )
    return worker


def _post_mortem(container: Any, stderr: bytearray) -> str:
    """What is known of a fork-server that died before its handshake: its stderr and its container's state."""
    try:
        container.reload()
        state = container.attrs.get("State", {})
        where = f"its container was {state.get('Status')} (exit code {state.get('ExitCode')})"
    except Exception as e:  # removed (auto_remove): it stopped
        where = f"its container is gone ({type(e).__name__}: it stopped and the engine removed it)"
    said = stderr.decode(errors="replace").strip() or "nothing"
    return f"{where}; the fork-server's stderr said: {said}"


def docker_sandbox(opts: DockerOptions, *, pool_size: int, limits: Limits, max_calls: int) -> PooledSandbox:
    client = docker_client(opts.docker_host)
    try:
        client.images.get(opts.image)
    except Exception as e:
        raise SandboxError(
            f"docker backend: image {opts.image!r} not found ({e}); build it offline with "
            f"`agent-rl sandbox build-image --tag {opts.image}`"
        ) from e
    if opts.seccomp:
        filter_bpf()  # raises, saying what to install, when libseccomp cannot be loaded
    removed = remove_orphans(client)
    if removed:
        print(
            f"docker backend: removed {len(removed)} orphan sandbox container(s) whose owner is gone",
            file=sys.stderr,
        )
    python = opts.python or image_python()
    labels = Labels(pool=uuid.uuid4().hex[:12], run=opts.run or owner_id())
    return PooledSandbox(
        lambda: launch_docker(client, opts, limits, python, labels),
        pool_size=pool_size,
        limits=limits,
        max_calls=max_calls,
        name="docker",
    )
