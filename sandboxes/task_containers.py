"""Containers for tasks whose tools do real work: one fresh container per episode, from a warm pool.

A task container (a Harbor task's image: a repository, its tests, a shell) is where an agent runs commands
and edits files for a whole episode; it is never reused, so an episode cannot see what the one before did.
The pool keeps `warm` containers per image started ahead, so an episode's start is taking one from a
queue (a cold start is docker's ~150 ms create+start on top); a replacement starts in a background thread.

Hygiene, as for the code sandboxes (sandboxes/docker_engine.py): every container carries our labels
(owner process, pool, run); its main process is the watchdog, which exits once no other process is left in
the container, and the engine then removes it (`auto_remove`). Each container holds a "lifeline" exec,
a process reading stdin from an attached socket that this process keeps open: when this process dies, even
by SIGKILL, the socket closes, the lifeline exits, and the container removes itself. A new pool also removes
our containers whose owner is gone (a daemon restart leaves such leftovers behind).

Limits: the task's cpus and memory (cgroup), a pids limit, no network unless the task allows it and the
pool does, all capabilities dropped except those a shell needs to own its files (the container's root is
not the host's root: user namespaces aside, it still cannot load modules, mount, or trace).
"""

from __future__ import annotations

import contextlib
import io
import queue
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes.api import SandboxError
from sandboxes.docker_engine import WATCHDOG, Labels, docker_client, our_containers, remove_orphans

MiB = 1 << 20
_TIMEOUT_EXIT = (124, 137)  # coreutils `timeout`: 124 when it sent TERM, 137 (128 + 9) after -k's KILL


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    seconds: float


@dataclass(frozen=True)
class ContainerSpec:
    """What a container is started with; containers of equal specs are interchangeable in the warm pool."""

    image: str
    python: str
    """The interpreter inside the image (the watchdog and lifeline run on it)."""
    cpus: float | None = None
    memory_mb: int | None = None
    network: bool = False
    pids: int = 512
    workdir: str = "/"
    env: tuple[tuple[str, str], ...] = ()


class TaskContainer:
    """One episode's container. `exec` runs a shell command under a time limit; files go in and out as tar."""

    def __init__(self, container: Any, lifeline: Any, spec: ContainerSpec):
        self._c = container
        self._lifeline = lifeline
        self.spec = spec
        self.closed = False

    @property
    def id(self) -> str:
        return self._c.id

    def exec(
        self,
        command: str,
        *,
        timeout_s: float,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """`bash -c command` under coreutils `timeout` (docker's exec has no time limit of its own)."""
        start = time.perf_counter()
        argv = ["timeout", "-k", "2", f"{timeout_s:g}", "bash", "-c", command]
        try:
            code, (out, err) = self._c.exec_run(
                argv, workdir=workdir or self.spec.workdir, environment=env or {}, user=user or "", demux=True
            )
        except Exception as e:
            raise SandboxError(f"container {self._c.short_id}: exec failed (killed or removed?): {e}") from e
        if code is None:
            raise SandboxError(f"container {self._c.short_id}: exec returned no status (container gone?)")
        text = lambda b: (b or b"").decode(errors="replace")  # noqa: E731
        return ExecResult(text(out), text(err), code, code in _TIMEOUT_EXIT, time.perf_counter() - start)

    def put_dir(self, src: Path, dest: str) -> None:
        """Copy the directory `src` to `dest` (created) inside the container."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=_in_root(dest))
        self._put(dest, buf.getvalue())

    def put_files(self, dest: str, files: dict[str, bytes], mode: int = 0o644) -> None:
        """Write `files` (name -> bytes) into the directory `dest` (created) inside the container."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(f"{_in_root(dest)}/{name}")
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
        self._put(dest, buf.getvalue())

    def _put(self, dest: str, data: bytes) -> None:
        """Unpack `data` (its paths relative to /) at the container's root: the engine creates the missing parent
        directories, so no `mkdir` runs first (an exec: a process in the container, per copy, per episode)."""
        try:
            self._c.put_archive("/", data)
        except Exception as e:
            raise SandboxError(f"container {self._c.short_id}: cannot copy files to {dest}: {e}") from e

    def read_file(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        tar = self._get(path)
        if tar is None:
            return None
        with tar:
            member = tar.next()
            if member is None or not member.isfile():
                return None
            f = tar.extractfile(member)
            return f.read() if f else None

    def read_files(self, path: str) -> dict[str, bytes]:
        """The regular files directly in the directory `path`, by name ({} when it does not exist): one request
        for them all."""
        tar = self._get(path)
        if tar is None:
            return {}
        out: dict[str, bytes] = {}
        with tar:
            for member in tar:  # the directory's own name, then its entries: DIR/NAME
                parts = member.name.split("/")
                if member.isfile() and len(parts) == 2 and (f := tar.extractfile(member)) is not None:
                    out[parts[1]] = f.read()
        return out

    def _get(self, path: str) -> tarfile.TarFile | None:
        try:
            stream, _ = self._c.get_archive(path)
        except Exception as e:
            if "No such" in str(e) or "404" in str(e) or "Could not find" in str(e):
                return None
            raise SandboxError(f"container {self._c.short_id}: cannot read {path}: {e}") from e
        return tarfile.open(fileobj=io.BytesIO(b"".join(stream)))

    def commit(self, repository: str, tag: str, changes: list[str]) -> str:
        self._c.commit(repository=repository, tag=tag, changes=changes)
        return f"{repository}:{tag}"

    def close(self) -> None:
        """Remove the container now (idempotent)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self._lifeline.close()
        try:
            self._c.remove(force=True)
        except Exception as e:  # already gone: auto-removed after the lifeline closed
            if (
                "No such container" not in str(e)
                and "already in progress" not in str(e)
                and "404" not in str(e)
            ):
                raise SandboxError(f"cannot remove container {self._c.short_id}: {e}") from e


class ContainerPool:
    """Starts task containers, `warm` per spec ahead of need; `close()` removes every container it made."""

    def __init__(self, docker_host: str | None, *, run: str, pool: str = "tasks", warm: int = 1):
        self.docker_host = docker_host
        self.client = docker_client(docker_host)
        remove_orphans(self.client)
        self.labels = Labels(pool=pool, run=run)
        self.warm = warm
        self._ready: dict[ContainerSpec, queue.SimpleQueue[TaskContainer | BaseException]] = {}
        self._lock = threading.RLock()
        self._live: set[TaskContainer] = set()
        self._refills: list[threading.Thread] = []
        self._closed = False

    def start(self, spec: ContainerSpec) -> TaskContainer:
        """A fresh container for one episode (from the warm queue when one is ready)."""
        if self._closed:
            raise SandboxError("the container pool is closed")
        with self._lock:
            q = self._ready.get(spec)
            if q is None:
                q = self._ready[spec] = queue.SimpleQueue()
                for _ in range(self.warm):
                    self._refill(spec, q)
        if self.warm == 0:
            return self._track(self._create(spec))
        item = self._take(q)
        self._refill(spec, q)
        if isinstance(item, BaseException):
            raise item
        return item

    def _take(self, q: queue.SimpleQueue) -> TaskContainer | BaseException:
        """The next started container (or failed start) of `q`; SandboxError once the pool closes."""
        while True:
            try:
                return q.get(timeout=0.5)
            except queue.Empty:
                if self._closed:  # its refill may never come: close() does not wait for starts under way
                    raise SandboxError("the container pool is closed") from None

    def ready(self, spec: ContainerSpec) -> int:
        """How many containers of `spec` are started and waiting (a failed start counts too)."""
        with self._lock:
            q = self._ready.get(spec)
        return 0 if q is None else q.qsize()

    def _track(self, c: TaskContainer) -> TaskContainer:
        with self._lock:
            self._live.add(c)
            if self._closed:
                c.close()
                raise SandboxError("the container pool is closed")
        return c

    def _refill(self, spec: ContainerSpec, q: queue.SimpleQueue) -> None:
        def work() -> None:
            try:
                q.put(self._track(self._create(spec)))
            except BaseException as e:  # delivered to whoever takes it: an infrastructure error there
                q.put(e)

        thread = threading.Thread(target=work, daemon=True, name="container-refill")
        with self._lock:
            self._refills = [t for t in self._refills if t.is_alive()] + [thread]
        thread.start()

    def _create(self, spec: ContainerSpec) -> TaskContainer:
        kwargs: dict[str, Any] = {}
        if spec.cpus:
            kwargs["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.memory_mb:
            kwargs["mem_limit"] = kwargs["memswap_limit"] = spec.memory_mb * MiB
        try:
            container = self.client.containers.run(
                spec.image,
                command=[spec.python, "-I", "-c", WATCHDOG],
                labels=self.labels.as_dict(),
                detach=True,
                init=True,
                network_mode="bridge" if spec.network else "none",
                pids_limit=spec.pids,
                cap_drop=["ALL"],
                cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges"],
                environment=dict(spec.env),
                working_dir=spec.workdir,
                auto_remove=True,
                **kwargs,
            )
        except Exception as e:
            raise SandboxError(f"cannot start a container from {spec.image!r}: {e}") from e
        try:
            exec_id = self.client.api.exec_create(
                container.id, [spec.python, "-I", "-c", _LIFELINE], stdin=True
            )
            lifeline = self.client.api.exec_start(exec_id["Id"], socket=True)
        except Exception as e:
            with contextlib.suppress(Exception):
                container.remove(force=True)
            raise SandboxError(
                f"container {container.short_id} from {spec.image!r} did not start: {e}"
            ) from e
        return TaskContainer(container, lifeline, spec)

    def release(self, c: TaskContainer) -> None:
        """The episode is over: its container goes (never reused)."""
        with self._lock:
            self._live.discard(c)
        c.close()

    def close(self, start_timeout_s: float = 30.0) -> None:
        """Remove every container this pool started, the warm ones included.

        The live ones go first (a command or verifier blocked in one returns at once); then the starts under way
        are waited for, all together up to `start_timeout_s` (each removes its container itself once it is up,
        `_track`), and whatever carries this pool's labels is removed."""
        with self._lock:
            self._closed = True
            live = list(self._live)
            self._live.clear()
            refills = list(self._refills)
        _each(live, TaskContainer.close)
        deadline = time.monotonic() + start_timeout_s
        for t in refills:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        left = our_containers(
            self.client, **{"agent-rl.pool": self.labels.pool, "agent-rl.run": self.labels.run}
        )
        _each(left, lambda c: c.remove(force=True))


def _in_root(dest: str) -> str:
    """`dest` as a path in a tar unpacked at / ("." for / itself)."""
    return dest.strip("/") or "."


def _each(items: list[Any], fn: Any, threads: int = 16) -> None:
    """`fn(item)` for every item, `threads` at a time (a removal mostly waits on the engine, and a run's pool holds
    up to its episodes plus its warm ones), failures ignored: what is already gone is gone."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: Any) -> None:
        with contextlib.suppress(Exception):
            fn(item)

    if items:
        with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="container-remove") as ex:
            list(ex.map(one, items))


# Held by an attached exec: reads stdin until it closes (this process died or closed the container).
_LIFELINE = "import sys\nwhile sys.stdin.buffer.read(65536):\n    pass\n"
