"""Faults injected into real local sandboxes: a fork-server that stops answering (SIGSTOP) and one killed
mid-call (SIGKILL), at the pool and through a rollout episode.

The engine in the episode test is a fake at the EngineClient boundary (scripted tokens); the env runs
its code in a real sandbox whose fork-server is really stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandboxes
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.engines.api import Generation, SamplingParams
from agent_rl.rollout.workers import PromptSource, Rollouts
from agent_rl.types import FinishReason
from envs.types import StepInfo, StepResult, Task
from sandboxes import Limits, SandboxError
from sandboxes.pool import PooledSandbox
from sandboxes.worker import HOST_GRACE_S, INSIDE_FORKSERVER


def forkserver_pids() -> list[int]:
    """Fork-servers started by this test process (descendants whose argv names the fork-server)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            parent[int(name)] = int(stat[stat.rfind(b")") + 2 :].split()[1])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in mine}
        mine |= frontier

    def is_forkserver(pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return INSIDE_FORKSERVER.encode() in argv and argv[0] != b"bwrap"

    # A call's process is a fork of its fork-server (same argv): keep the servers, not their children.
    return [pid for pid in mine if is_forkserver(pid) and not is_forkserver(parent.get(pid, 0))]


def signal_forkservers(sig: int) -> int:
    pids = forkserver_pids()
    for pid in pids:
        os.kill(pid, sig)
    return len(pids)


async def test_hung_worker_raises_sandbox_error_and_is_replaced() -> None:
    async with sandboxes.create("local", pool_size=1) as sb:
        await sb.start()
        assert signal_forkservers(signal.SIGSTOP) == 1
        with pytest.raises(SandboxError, match=r"sent no reply to run within its 0.5 s timeout \+ 5 s"):
            await sb.run("print(1)", limits=Limits(timeout_s=0.5))
        after = await sb.run("print(2)")
        assert isinstance(sb, PooledSandbox)
        assert after.stdout == "2\n" and sb.stats.hung == 1 and sb.stats.worker_deaths == 1


async def test_worker_killed_mid_call_is_retried_on_a_fresh_worker() -> None:
    async with sandboxes.create("local", pool_size=1) as sb:
        await sb.start()
        assert isinstance(sb, PooledSandbox)
        call = asyncio.ensure_future(sb.run("import time; time.sleep(1); print('done')"))
        while sb.stats.in_flight == 0:
            await asyncio.sleep(0.01)
        assert signal_forkservers(signal.SIGKILL) == 1
        result = await call
    assert (result.stdout, result.exit_code) == ("done\n", 0), result
    assert sb.stats.retries == 1 and sb.stats.worker_deaths == 1


@dataclass
class ScriptedEngine:
    """Answers every turn with the same 3 tokens at version 0 (a fake at the EngineClient boundary)."""

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        await asyncio.sleep(0)
        return Generation([5, 6, 7], [-1.0] * 3, [0] * 3, "stop")

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def update_weights(self, *, version: int, path: object = None, tensors: object = None) -> None: ...
    async def health(self) -> bool:
        return True

    async def close(self) -> None: ...


class SandboxEnv:
    """One turn that runs `print(1)` in a real sandbox; reward 1 when it printed 1."""

    stop_strings = ("```",)
    max_new_tokens = 3
    group_size = 2

    def __init__(self, sb: sandboxes.Sandbox):
        self.sb = sb

    def reset(self, task: Task) -> list[int]:
        return [1, 2, 3]

    async def step(self, sampled_ids: list[int], *, truncated: bool = False) -> StepResult:
        result = await self.sb.run("print(1)", limits=Limits(timeout_s=0.5))
        reward = 1.0 if result.stdout == "1\n" else 0.0
        return StepResult(
            [9], reward, True, StepInfo(finish="answer", code_ran=True, exit_code=result.exit_code)
        )

    async def close(self) -> None: ...


async def test_hung_sandbox_call_fails_the_episode_which_is_retried_not_scored_zero() -> None:
    async with sandboxes.create("local", pool_size=1) as sb:
        await sb.start()
        assert signal_forkservers(signal.SIGSTOP) == 1  # the first call never returns
        buf = RolloutBuffer(BufferConfig(max_staleness=1), batch_prompts=1, group_size=2)
        prompts = PromptSource([Task("t0", "1+1", "2"), Task("t1", "2+2", "4")], seed=0)
        r = Rollouts(
            RolloutConfig(max_retries=1, max_errors=100),
            buf,
            prompts,
            lambda: SandboxEnv(sb),
            ScriptedEngine(),
            max_seq_len=64,
            seed=0,
        )
        r.start()
        (group,) = await asyncio.wait_for(r.buffer.take(1), 60 + HOST_GRACE_S)
        await r.stop()
    assert r.counters.infra_retries >= 1 and "sandbox_killed" in (r.last_error or "")
    assert "sent no reply" in (r.last_error or "")
    # The episode whose call hung failed (an infrastructure failure, agent_rl/failures.py) and was run again
    # from the start; its calls then ran on the pool's fresh worker: no reward 0 from the hang.
    assert r.counters.errors == 0
    assert [t.reward for t in group.trajectories] == [1.0, 1.0]
    assert all(t.finish_reason == FinishReason.ANSWER for t in group.trajectories)


async def test_hung_call_through_the_http_service_is_a_sandbox_error_at_the_client() -> None:
    from aiohttp.test_utils import TestServer

    from sandboxes.server import SandboxService

    srv = TestServer(SandboxService(sandboxes.create("local", pool_size=1), Limits(timeout_s=0.5)).app())
    await srv.start_server()
    try:
        async with sandboxes.create("http", url=str(srv.make_url("/"))) as client:
            assert (await client.run("print(1)")).stdout == "1\n"
            assert signal_forkservers(signal.SIGSTOP) == 1
            with pytest.raises(SandboxError, match="HTTP 503: .*sent no reply to run"):
                await client.run("print(2)", limits=Limits(timeout_s=0.5))
            assert (await client.run("print(3)")).stdout == "3\n"  # the service replaced its worker
    finally:
        await srv.close()
