"""The local (bubblewrap fork-server) backend: adversarial containment, sessions, concurrency, API errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sandbox_adversarial import (
    CASES,
    FAKE_SECRET,
    Case,
    background_process_does_not_survive_into_next_call,
    still_works,
)

import sandboxes
from sandboxes import Limits, SandboxError
from sandboxes.pool import PooledSandbox


@pytest.fixture
async def local_sb(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[sandboxes.Sandbox]:
    monkeypatch.setenv("AGENT_RL_FAKE_SECRET", FAKE_SECRET)
    async with sandboxes.create("local", pool_size=1) as sb:
        yield sb


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
async def test_local_contains(local_sb: sandboxes.Sandbox, case: Case) -> None:
    await case(local_sb)


async def test_local_runs_as_nobody_with_host_numpy() -> None:
    async with sandboxes.create("local") as sb:
        result = await sb.run("import os, numpy\nprint(os.getuid(), numpy.arange(4).sum())")
    assert result.stdout == "65534 6\n", result


async def test_local_stdin_and_files_reach_the_code() -> None:
    async with sandboxes.create("local") as sb:
        result = await sb.run(
            "import sys\nprint(sys.stdin.read().upper(), open('data/in.txt').read())",
            stdin="abc",
            files={"data/in.txt": "xyz", "raw.bin": b"\x00\x01"},
        )
    assert result.stdout == "ABC xyz\n", result


async def test_local_error_gives_traceback_and_exit_code() -> None:
    async with sandboxes.create("local") as sb:
        result = await sb.run("import sys\nprint('before')\nsys.exit(3)")
        crash = await sb.run("1 / 0")
    assert (result.stdout, result.exit_code) == ("before\n", 3)
    assert crash.exit_code == 1 and crash.stderr.splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert 'File "<string>", line 1' in crash.stderr


async def test_two_hundred_concurrent_calls_through_one_pool_are_correct_and_distinct() -> None:
    async with sandboxes.create("local", pool_size=4) as sb:
        results = await asyncio.gather(*(sb.run(f"print({i} * {i})") for i in range(200)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(200)]
    assert all(r.exit_code == 0 for r in results)


async def test_session_keeps_variables_and_fresh_calls_do_not_see_them() -> None:
    async with sandboxes.create("local", pool_size=2) as sb, sb.session() as s:
        assert (await s.run("x = 41\nimport math")).exit_code == 0
        second = await s.run("print(x + 1, math.pi > 3)")
        other = await sb.run("print('x' in globals())")
    assert second.stdout == "42 True\n", second
    assert other.stdout == "False\n", other


async def test_session_timeout_loses_state_and_says_so() -> None:
    async with sandboxes.create("local") as sb, sb.session() as s:
        await s.run("x = 1")
        hung = await s.run("while True: pass", limits=Limits(timeout_s=1))
        after = await s.run("print('x' in globals())")
    assert hung.timed_out, hung
    assert after.stdout == "False\n" and "state was lost" in after.stderr, after


async def test_worker_is_replaced_after_max_calls() -> None:
    async with sandboxes.create("local", max_calls=2) as sb:
        for _ in range(5):
            await still_works(sb)
        assert isinstance(sb, PooledSandbox)
        assert sb.stats.recycled == 2 and sb.stats.calls == 5


async def test_unsafe_subprocess_refuses_without_explicit_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_RL_ALLOW_UNSAFE_SANDBOX", raising=False)
    with pytest.raises(SandboxError, match="NO isolation.*allow_unsafe=True"):
        sandboxes.create("unsafe-subprocess")


async def test_unsafe_subprocess_runs_when_allowed() -> None:
    async with sandboxes.create("unsafe-subprocess", allow_unsafe=True, pool_size=2) as sb:
        results = await asyncio.gather(*(sb.run(f"print({i})") for i in range(20)))
        hung = await sb.run("import time; time.sleep(30)", limits=Limits(timeout_s=0.5))
        await background_process_does_not_survive_into_next_call(sb)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    assert hung.timed_out


def test_bad_arguments_are_rejected_with_the_value() -> None:
    with pytest.raises(ValueError, match="unknown sandbox backend 'nope'"):
        sandboxes.create("nope")
    with pytest.raises(TypeError, match="unknown option.*'pool'"):
        sandboxes.create("local", pool=3)
    with pytest.raises(ValueError, match="Limits.timeout_s must be > 0, got -1"):
        Limits(timeout_s=-1)


async def test_file_paths_escaping_the_workdir_are_rejected() -> None:
    async with sandboxes.create("local") as sb:
        with pytest.raises(ValueError, match="'../etc/x' must be a relative path"):
            await sb.run("pass", files={"../etc/x": "x"})


def test_missing_libseccomp_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxes import seccomp

    seccomp.filter_bpf.cache_clear()
    monkeypatch.setitem(__import__("sys").modules, "pyseccomp", None)  # import fails as when not installed
    try:
        with pytest.raises(SandboxError, match="pip install pyseccomp.*seccomp=False"):
            sandboxes.create("local")
    finally:
        seccomp.filter_bpf.cache_clear()


async def test_seccomp_false_runs_without_the_filter() -> None:
    async with sandboxes.create("local", seccomp=False) as sb:
        result = await sb.run("print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])")
    assert result.stdout == "0\n", result


def test_the_namespace_probe_binds_only_the_system_folders_the_sandbox_binds() -> None:
    """The probe of check_available once bound the whole of / recursively: a container's overlay that a Docker
    engine removed meanwhile failed it with "bwrap cannot create namespaces here" (seen in a main-job run beside a
    dockerd). The race cannot be replayed on an event, so this checks what removes it: the probe binds what the
    sandbox binds (/usr and the top-level lib/bin entries), never / or a path of /tmp, and it passes here."""
    from sandboxes.local import LocalOptions, check_available, probe_command, system_binds

    opts = LocalOptions()
    cmd = probe_command(opts)
    sources = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("--bind", "--ro-bind", "--dev-bind")]
    assert "/" not in sources and not any(s.startswith("/tmp") for s in sources), cmd
    assert " ".join(system_binds()) in " ".join(cmd)
    check_available(opts)  # namespaces usable on this machine (the suite's sandboxes run here)
