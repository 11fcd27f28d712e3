"""A private Docker engine for the docker-marked tests: own data-root, exec-root and socket in a temp dir.

Started once per session, image built offline from this Python, stopped afterwards. The tests
skip (saying why) only when dockerd is missing or cannot start here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_test_image import TEST_IMAGE


def _start_dockerd(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    sock = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        [
            "dockerd",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={root / 'dockerd.pid'}",
            f"-H=unix://{sock}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, f"unix://{sock}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    if shutil.which("dockerd") is None:
        pytest.skip("dockerd not installed (apt-get install docker.io, or scripts/install_system_deps.sh)")
    if os.geteuid() != 0:
        pytest.skip("the private dockerd for these tests needs root")
    import docker

    from sandboxes.image import build_image

    root = Path(tempfile.mkdtemp(prefix="agent-rl-dockerd-"))
    proc, host = _start_dockerd(root)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                docker.DockerClient(base_url=host).ping()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
                    pytest.skip(f"dockerd could not start here: {tail}")
                time.sleep(0.2)
        build_image(
            TEST_IMAGE, docker_host=host, packages=("numpy",)
        )  # sympy: not needed here, slower to build
        yield host
    finally:
        _stop(proc)
        # Deleting the image layers can take minutes on a busy disk: do it in the background.
        subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True)
