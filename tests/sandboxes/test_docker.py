"""The docker backend against a private dockerd: the same adversarial suite as local, plus engine specifics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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
