"""A private Docker engine for one run, on a machine where none is running: own data-root, exec-root and socket.

The swe_tiny pipeline (examples/swe_tiny.py) and the Harbor benchmarks need an engine; when DOCKER_HOST or the
default socket answers they use it, else (as root, with dockerd installed) they start this one, with no
bridge and no iptables rules (task containers have no network), and stop it when they end. A `data_root`
that outlives the run keeps the built images, so a resumed run does not rebuild them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


class DockerdError(RuntimeError):
    pass


class PrivateDockerd:
    def __init__(self, root: Path):
        self.root = root
        self.host = f"unix://{root / 'docker.sock'}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> str:
        """Start dockerd and wait until it answers; returns its DOCKER_HOST."""
        import docker

        if shutil.which("dockerd") is None:
            raise DockerdError(
                "no Docker engine answers and dockerd is not installed: apt-get install docker.io"
            )
        if os.geteuid() != 0:
            raise DockerdError("no Docker engine answers, and starting a private dockerd needs root")
        self.root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.root / "docker.sock").unlink()  # left by a dockerd killed earlier
        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none",
             f"--data-root={self.root / 'data'}", f"--exec-root={self.root / 'exec'}",
             f"--pidfile={self.root / 'dockerd.pid'}", f"-H={self.host}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                docker.DockerClient(base_url=self.host).ping()
                return self.host
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.root / "dockerd.log").read_text(errors="replace")[-1000:]
                    self.stop()
                    raise DockerdError(
                        f"dockerd did not start (log {self.root / 'dockerd.log'}): {tail}"
                    ) from None
                time.sleep(0.1)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (dockerd stops its containers, auto-removed ones go), SIGKILL past the timeout."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def engine_answers(docker_host: str | None) -> bool:
    try:
        import docker

        client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
        client.ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def docker_engine(docker_host: str | None = None, *, data_root: Path | None = None) -> Iterator[str | None]:
    """The engine to use: `docker_host` (or DOCKER_HOST's) when it answers, else a private dockerd for the block.
    Yields the host to pass on (None: docker's default)."""
    if engine_answers(docker_host):
        yield docker_host
        return
    temp = data_root is None
    root = data_root or Path(tempfile.mkdtemp(prefix="agent-rl-dockerd-"))
    engine = PrivateDockerd(root)
    try:
        yield engine.start()
    finally:
        engine.stop()
        if temp:  # image layers can take a while to delete on a busy disk: in the background
            subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True)
