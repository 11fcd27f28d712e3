"""The docker backend against a private dockerd: the same adversarial suite as local, plus engine specifics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from docker_test_image import TEST_IMAGE
from sandbox_adversarial import CASES, FAKE_SECRET, Case, still_works

import sandboxes
from sandboxes import SandboxError

pytestmark = pytest.mark.docker


@pytest.fixture
async def docker_sb(docker_host: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[sandboxes.Sandbox]:
    monkeypatch.setenv("AGENT_RL_FAKE_SECRET", FAKE_SECRET)
    async with sandboxes.create("docker", image=TEST_IMAGE, docker_host=docker_host) as sb:
        yield sb


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
async def test_docker_contains(docker_sb: sandboxes.Sandbox, case: Case) -> None:
    await case(docker_sb)


async def test_docker_engine_socket_is_unreachable(docker_sb: sandboxes.Sandbox, docker_host: str) -> None:
    sock = docker_host.removeprefix("unix://")
    result = await docker_sb.run(
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({sock!r}); print('CONNECTED')\n"
        "except OSError as e:\n    print('blocked', e)\n"
    )
    assert "blocked" in result.stdout, result
    await still_works(docker_sb)


async def test_docker_runs_numpy_as_nobody(docker_sb: sandboxes.Sandbox) -> None:
    result = await docker_sb.run("import os, numpy\nprint(os.getuid(), numpy.arange(4).sum())")
    assert result.stdout == "65534 6\n", result


async def test_docker_sessions_keep_state(docker_sb: sandboxes.Sandbox) -> None:
    async with docker_sb.session() as s:
        await s.run("x = 41")
        assert (await s.run("print(x + 1)")).stdout == "42\n"


async def test_docker_two_hundred_concurrent_calls_are_correct(docker_host: str) -> None:
    async with sandboxes.create("docker", image=TEST_IMAGE, docker_host=docker_host, pool_size=3) as sb:
        results = await asyncio.gather(*(sb.run(f"print({i} + 1)") for i in range(200)))
    assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(200)]


async def test_docker_missing_image_names_the_build_command(docker_host: str) -> None:
    with pytest.raises(SandboxError, match="agent-rl sandbox build-image --tag nope:1"):
        sandboxes.create("docker", image="nope:1", docker_host=docker_host)


# ---- container hygiene (issue 15) -----------------------------------------------------------


def _count(client: Any, run: str) -> int:
    from sandboxes.docker_engine import our_containers

    return len(our_containers(client, **{"agent-rl.run": run}))


def _wait_for_count(client: Any, run: str, want: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (n := _count(client, run)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sandbox_serve_removes_its_containers_on_sigterm(docker_host: str) -> None:
    import docker

    client = docker.DockerClient(base_url=docker_host)
    run = f"serve-sigterm-{os.getpid()}"
    port = _free_port()
    cmd = [sys.executable, "-m", "sandboxes", "serve", "--backend", "docker", "--docker-image", TEST_IMAGE]
    cmd += ["--docker-host", docker_host, "--pool-size", "3", "--port", str(port), "--run", run]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "sandbox service (docker, pool 3)" in banner, banner + proc.stdout.read()
        assert _count(client, run) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "sandbox service stopped" in proc.stdout.read()
    finally:
        proc.kill()
    assert _count(client, run) == 0


def test_containers_of_a_killed_owner_remove_themselves(docker_host: str) -> None:
    import docker

    client = docker.DockerClient(base_url=docker_host)
    run = f"owner-killed-{os.getpid()}"
    script = (
        "import asyncio, sys, sandboxes\n"
        "async def main():\n"
        f"    sb = sandboxes.create('docker', image={TEST_IMAGE!r}, docker_host={docker_host!r}, pool_size=2, run={run!r})\n"
        "    await sb.start()\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert _count(client, run) == 2
    finally:
        proc.kill()  # SIGKILL: no clean-up code runs in the owner
        proc.wait()
    # The exec streams close, the fork-servers exit, each container's watchdog sees it and exits (--rm).
    assert _wait_for_count(client, run, 0, timeout_s=60) == 0


def test_orphans_whose_owner_is_gone_are_removed_at_start(docker_host: str) -> None:
    import docker

    from sandboxes.docker_engine import LABEL, LABEL_OWNER, LABEL_RUN, our_containers, owner_id
    from sandboxes.image import image_python

    client = docker.DockerClient(base_url=docker_host)
    run = f"orphans-{os.getpid()}"
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_owner = f"{socket.gethostname()}:{gone.pid}:1"
    foreign_owner = "some-other-host:1:1"  # another machine's container: never ours to judge
    started = []
    for owner in (dead_owner, dead_owner, owner_id(), foreign_owner):
        started.append(
            client.containers.run(
                TEST_IMAGE,
                command=[image_python(), "-c", "import time; time.sleep(600)"],
                labels={LABEL: "1", LABEL_RUN: run, LABEL_OWNER: owner},
                detach=True,
                network_mode="none",
            )
        )
    try:
        assert _count(client, run) == 4
        sandboxes.create("docker", image=TEST_IMAGE, docker_host=docker_host)  # sweeps at start
        left = {c.labels[LABEL_OWNER] for c in our_containers(client, **{LABEL_RUN: run})}
        assert left == {owner_id(), foreign_owner}
    finally:
        for c in started:
            with contextlib.suppress(Exception):
                c.remove(force=True)


async def test_a_fork_server_that_dies_before_its_handshake_is_reported_with_its_stderr(
    docker_host: str,
) -> None:
    sb = sandboxes.create("docker", image=TEST_IMAGE, docker_host=docker_host, preload=["no_such_module_q"])
    with pytest.raises(SandboxError, match="(?s)stderr said: .*No module named 'no_such_module_q'"):
        await sb.start()
