"""Infrastructure failures injected into real episodes: each is retried, then marked with its cause and left out
of its group while the other members train (agent_rl/failures.py, docs/reliability.md).

What runs is real: the embedded engine (in-process, the session's tiny model; over HTTP where the engine's
server is stopped), local sandboxes (bubblewrap fork-servers), the sandbox HTTP service in its own process (killed
with SIGKILL), verifier subprocesses, the gateway with an agent env. No failure depends on timing: each happens
at a point of the episode the env reaches (after its first turn, in its verifier), and a verifier that "times
out" is a process that cannot finish before its timeout, because what it waits for comes only after it.

A group of three; member 1 fails (every try unless said otherwise). Each runner below is one member's
(`EpisodeRunner` is what the rollout workers run; one per member lets each member have its own env).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import envs
import sandboxes
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.engines.api import EngineOptions
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.failures import InfraFailureRate
from agent_rl.rollout.episodes import EpisodeRunner, RolloutCounters
from agent_rl.rollout.workers import PromptSource, Rates, Rollouts
from agent_rl.types import FinishReason, Group
from envs.types import InfraFailure, StepInfo, StepResult, Task

DATA = Path(__file__).parent / "data"
N = 3  # members per group; member 1 fails
TASK = Task("q0", "Compute 3 * 4", "12")
# one engine retry and one episode retry, no waiting: backoff_s is tested on its own (test_infra_groups.py)
CFG = RolloutConfig(max_retries=1, infra_retries=1, infra_backoff_s=0.0, infra_backoff_max_s=0.0)


class TwoTurnEnv:
    """Two turns, each running real code in `sandbox`; the episode's reward is `verify`'s (a subclass's)."""

    stop_strings: tuple[str, ...] = ()
    max_new_tokens = 4
    group_size = N

    def __init__(self, sandbox: sandboxes.Sandbox):
        self.sandbox, self.turn = sandbox, 0

    def reset(self, task: Task) -> list[int]:
        self.turn = 0
        return [5, 6, 7]

    async def step(self, sampled_ids: list[int], *, truncated: bool = False) -> StepResult:
        self.turn += 1
        res = await self.sandbox.run(f"print({len(sampled_ids)})")
        info = dict(code_ran=True, exit_code=res.exit_code)
        if self.turn == 1:
            await self.after_first_turn()
            return StepResult([9], None, False, StepInfo(**info))
        reward, timed_out = await self.verify(sampled_ids)
        return StepResult([], reward, True, StepInfo(finish="answer", reward_timed_out=timed_out, **info))

    async def after_first_turn(self) -> None: ...

    async def verify(self, sampled_ids: list[int]) -> tuple[float | None, bool]:
        return (sum(sampled_ids) % 4) / 4, False

    async def close(self) -> None: ...


@pytest.fixture
async def engine(tiny_model_dir: Path):
    eng = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=8, max_seq_len=128), seed=0)
    yield eng
    await eng.close()


@pytest.fixture
async def sandbox():
    async with sandboxes.create("local", pool_size=2) as sb:
        yield sb


async def run_group(
    engine, healthy: Callable[[], TwoTurnEnv], failing: Callable[[], object], failing_engine=None
) -> tuple[Group, list[EpisodeRunner], list[int]]:
    """One group: members 0 and 2 with `healthy` envs, member 1 with `failing` ones. Returns the delivered group,
    the members' runners and how many envs member 1 made (one per try)."""
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)
    gid = buf.try_admit(TASK.id)
    tries = [0]

    def make_failing():
        tries[0] += 1
        return failing()

    runners = [
        EpisodeRunner(CFG, buf, healthy, engine, max_seq_len=128, seed=0),
        EpisodeRunner(CFG, buf, make_failing, failing_engine or engine, max_seq_len=128, seed=0),
        EpisodeRunner(CFG, buf, healthy, engine, max_seq_len=128, seed=0),
    ]
    await asyncio.gather(*(r.run(gid, TASK, i, None) for i, r in enumerate(runners)))
    batch = buf.try_take(1)
    assert batch is not None, "the group was not delivered"
    return batch[0], runners, tries


def assert_left_out(group: Group, runners: list[EpisodeRunner], tries: list[int], cause: str) -> None:
    """Member 1 was tried 1 + infra_retries times, then left out with `cause`; 0 and 2 trained."""
    assert tries == [1 + CFG.infra_retries]
    assert runners[1].counters.infra_retries == CFG.infra_retries
    assert [t.uid for t in group.trajectories] == ["g0/0", "g0/2"]
    assert all(t.finish_reason == FinishReason.ANSWER and t.reward is not None for t in group.trajectories)
    (failed,) = group.left_out
    assert (failed.uid, failed.finish_reason, failed.infra_cause) == (
        "g0/1",
        FinishReason.INFRA_FAILED,
        cause,
    )
    assert failed.reward is None and failed.num_sampled == 0  # never scored, its tokens never trained
    stats = Rates().stats(sum((r.counters for r in runners), RolloutCounters()), 0.0)
    causes = {k: v for k, v in stats.items() if k.startswith("rollout/infra_failed/")}
    assert stats["rollout/infra_failed"] == 1 and causes == {f"rollout/infra_failed/{cause}": 1}
    assert stats["rollout/infra_retries"] == CFG.infra_retries


async def test_a_sandbox_that_cannot_start_is_left_out_as_container_start(engine, sandbox) -> None:
    broken = sandboxes.create("local", python="/nonexistent/python3")  # its workers cannot start
    try:
        group, runners, tries = await run_group(
            engine, lambda: TwoTurnEnv(sandbox), lambda: TwoTurnEnv(broken)
        )
    finally:
        await broken.close()
    assert_left_out(group, runners, tries, "container_start")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sandbox_service() -> Iterator[tuple[subprocess.Popen, str]]:
    """`python -m sandboxes serve` in its own process (a sandbox a test can kill); its URL."""
    cmd = [sys.executable, "-m", "sandboxes", "serve", "--port", str(_free_port()), "--pool-size", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert " on http://127.0.0.1:" in line, line
    yield proc, line.split(" on ")[1].strip()
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=60)
    proc.stdout.close()


async def test_a_sandbox_killed_with_sigkill_mid_episode_is_left_out_as_sandbox_killed(
    engine, sandbox, sandbox_service
) -> None:
    proc, url = sandbox_service
    remote = sandboxes.create("http", url=url)

    class KilledAfterTurnOne(TwoTurnEnv):
        async def after_first_turn(self) -> None:
            if proc.poll() is None:  # the first try: its sandbox dies between its turns
                os.kill(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait)

    try:
        group, runners, tries = await run_group(
            engine, lambda: TwoTurnEnv(sandbox), lambda: KilledAfterTurnOne(remote)
        )
    finally:
        await remote.close()
    assert proc.returncode == -signal.SIGKILL
    assert_left_out(group, runners, tries, "sandbox_killed")


class SlowVerifier(TwoTurnEnv):
    """The verifier is a process that waits for its stdin to close, which happens only after the 0.2 s timeout
    has fired: it times out whatever the machine's speed (like a test.sh that hangs)."""

    async def verify(self, sampled_ids: list[int]) -> tuple[float | None, bool]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; sys.stdin.read()", stdin=asyncio.subprocess.PIPE
        )
        try:
            await asyncio.wait_for(proc.wait(), 0.2)
        except TimeoutError:
            raise InfraFailure("verifier_timeout", "the verifier ran past its 0.2 s") from None
        finally:
            proc.stdin.close()
            await proc.wait()
        raise AssertionError("the verifier finished before its stdin closed")


async def test_a_verifier_past_its_timeout_is_left_out_as_verifier_timeout(engine, sandbox) -> None:
    group, runners, tries = await run_group(
        engine, lambda: TwoTurnEnv(sandbox), lambda: SlowVerifier(sandbox)
    )
    assert_left_out(group, runners, tries, "verifier_timeout")


async def test_math_verify_killed_past_its_limit_is_verifier_timeout_not_reward_0(engine, sandbox) -> None:
    class TimedOutFlag(TwoTurnEnv):  # what envs/env.py reports when the math-verify pool killed its worker
        async def verify(self, sampled_ids: list[int]) -> tuple[float | None, bool]:
            return 0.0, True

    group, runners, tries = await run_group(
        engine, lambda: TwoTurnEnv(sandbox), lambda: TimedOutFlag(sandbox)
    )
    assert_left_out(group, runners, tries, "verifier_timeout")


class FileVerifier(TwoTurnEnv):
    """Reads the reward a verifier process writes to a file (Harbor's /logs/verifier/reward.txt); `script` is
    the verifier's Python."""

    script = ""

    async def verify(self, sampled_ids: list[int]) -> tuple[float | None, bool]:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            reward_file = Path(d) / "reward.txt"
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", self.script, str(reward_file))
            assert await proc.wait() == 0
            return (float(reward_file.read_text()) if reward_file.exists() else None), False


async def test_a_verifier_that_writes_no_reward_is_left_out_as_no_reward(engine, sandbox) -> None:
    class WritesNothing(FileVerifier):
        script = "import sys"  # exits 0 and writes no reward

    group, runners, tries = await run_group(
        engine, lambda: TwoTurnEnv(sandbox), lambda: WritesNothing(sandbox)
    )
    assert_left_out(group, runners, tries, "no_reward")


async def test_a_verifier_that_writes_nan_is_left_out_as_bad_reward(engine, sandbox) -> None:
    class WritesNan(FileVerifier):
        script = "import sys; open(sys.argv[1], 'w').write('nan')"

    group, runners, tries = await run_group(engine, lambda: TwoTurnEnv(sandbox), lambda: WritesNan(sandbox))
    assert_left_out(group, runners, tries, "bad_reward")


async def test_an_engine_whose_server_stops_mid_episode_is_left_out_as_engine(engine, sandbox) -> None:
    """Member 1 samples from the same embedded engine behind its HTTP server, which stops after member 1's
    first turn: its requests fail after max_retries, the episode fails on every try."""
    from aiohttp import web

    from agent_rl.engines.client import SGLangClient
    from agent_rl.engines.embedded.server import build_app

    port = _free_port()
    server = web.AppRunner(build_app(engine, "tiny"))
    await server.setup()
    await web.TCPSite(server, "127.0.0.1", port).start()
    remote = SGLangClient(f"http://127.0.0.1:{port}")

    class StopsTheEngine(TwoTurnEnv):
        async def after_first_turn(self) -> None:
            await server.cleanup()  # idempotent: the later tries fail at their first request

    try:
        group, runners, tries = await run_group(
            engine, lambda: TwoTurnEnv(sandbox), lambda: StopsTheEngine(sandbox), failing_engine=remote
        )
    finally:
        await server.cleanup()
        await remote.close()
    assert_left_out(group, runners, tries, "engine")
    assert runners[1].counters.engine_retries == 1 + CFG.infra_retries  # each try's request was retried once


async def test_an_episode_that_meets_the_engine_closed_at_the_runs_end_is_cancelled_not_an_infra_failure(
    tiny_model_dir: Path, sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's end closes the engines before it cancels the episodes (runtime._shutdown): an episode whose
    request meets the closed engine in between ends as cancelled (no retry, no infra_failed line, no error
    counted); while the run goes on, the same closed engine is an infrastructure failure, as before."""
    closed = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=8, max_seq_len=128), seed=0)
    await closed.close()
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)
    gid = buf.try_admit(TASK.id)
    runner = EpisodeRunner(CFG, buf, lambda: TwoTurnEnv(sandbox), closed, max_seq_len=128, seed=0)
    runner.stopping = True
    with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
        await runner.run(gid, TASK, 0, None)
    assert (runner.counters.errors, runner.counters.infra_retries) == (0, 0)
    assert "infra_failed" not in caplog.text
    runner.stopping = False
    await runner.run(gid, TASK, 1, None)
    assert runner.counters.infra_failed["engine"] == 1 and runner.counters.infra_retries == CFG.infra_retries
    assert "infra_failed: g0/1 left out" in caplog.text


@pytest.mark.slow  # an engine server process starts (~15 s on a loaded 2-core machine)
async def test_an_engine_process_killed_with_sigkill_mid_episode_is_left_out_as_engine(
    engine, sandbox, tiny_model_dir: Path
) -> None:
    """Member 1 samples from an engine server process (the same tiny model), killed with SIGKILL after member 1's
    first turn."""
    from agent_rl.engines.launch import launch_embedded

    handle = await asyncio.to_thread(
        launch_embedded, str(tiny_model_dir), EngineOptions(max_batch=8, max_seq_len=128), threads=1
    )
    remote = handle.client()

    class KillsTheEngine(TwoTurnEnv):
        async def after_first_turn(self) -> None:
            if handle.process.poll() is None:
                os.kill(handle.process.pid, signal.SIGKILL)
                await asyncio.to_thread(handle.process.wait)

    try:
        group, runners, tries = await run_group(
            engine, lambda: TwoTurnEnv(sandbox), lambda: KillsTheEngine(sandbox), failing_engine=remote
        )
    finally:
        await remote.close()
        handle.stop()
    assert handle.process.returncode == -signal.SIGKILL
    assert_left_out(group, runners, tries, "engine")


async def test_a_failure_that_passes_on_retry_keeps_the_member_in_its_group(engine, sandbox) -> None:
    made: list[int] = []

    def first_try_times_out() -> TwoTurnEnv:
        made.append(1)
        return SlowVerifier(sandbox) if len(made) == 1 else TwoTurnEnv(sandbox)

    group, runners, tries = await run_group(engine, lambda: TwoTurnEnv(sandbox), first_try_times_out)
    assert tries == [2] and runners[1].counters.infra_retries == 1 and runners[1].counters.errors == 0
    assert [t.uid for t in group.trajectories] == ["g0/0", "g0/1", "g0/2"] and group.left_out == []
    assert all(t.finish_reason == FinishReason.ANSWER for t in group.trajectories)


async def test_an_agent_that_raises_is_left_out_as_harness_crash(tiny_model_dir: Path) -> None:
    """An agent env through the gateway (type: agent); the agent of member 1 raises after its chat call."""
    from infra_agents import ATTEMPTS
    from transformers import AutoTokenizer

    spec = envs.load(DATA / "infra_agent.yaml")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    sandbox = envs.make_sandbox(spec)
    eng = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=8, max_seq_len=256), seed=0)
    buffer = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)
    tasks = envs.make(spec, tok, sandbox).tasks("train")
    rollouts = Rollouts(
        CFG, buffer, PromptSource(tasks, seed=0), lambda: envs.make(spec, tok, sandbox), eng,
        max_seq_len=256, seed=0,
    )  # fmt: skip
    ATTEMPTS.clear()
    rollouts.start()
    try:
        (group,) = await buffer.take(1)
    finally:
        await rollouts.stop()
        await sandbox.close()
        await eng.close()
    assert ATTEMPTS["g0-1"] == 1 + CFG.infra_retries and rollouts.counters.infra_retries == CFG.infra_retries
    assert [t.uid for t in group.trajectories] == ["g0/0", "g0/2"]
    (failed,) = group.left_out
    assert (failed.uid, failed.infra_cause, failed.reward) == ("g0/1", "harness_crash", None)
    assert "the harness crashed" in (rollouts.last_error or "")
    assert rollouts.stats()["rollout/infra_failed/harness_crash"] == 1


def _rollouts(engine, make_env: Callable[[], TwoTurnEnv], fraction: float) -> Rollouts:
    """The rollout workers over two tasks, one group at a time (k=0, one prompt per batch)."""
    buffer = RolloutBuffer(
        BufferConfig(max_staleness=0, max_infra_failed_fraction=fraction), batch_prompts=1, group_size=N
    )
    prompts = PromptSource([TASK, Task("q1", "Compute 2 + 5", "7")], seed=0)
    return Rollouts(CFG, buffer, prompts, make_env, engine, max_seq_len=128, seed=0)


async def test_a_group_whose_members_all_failed_is_dropped_and_its_prompt_sampled_again(
    engine, sandbox
) -> None:
    """The first group's every try meets a sandbox that cannot start; the group is dropped, its prompt comes back
    first, and the group sampled again (with a working sandbox) is the one trained."""
    broken = sandboxes.create("local", python="/nonexistent/python3")
    made: list[str] = []

    class Recorded(TwoTurnEnv):
        def reset(self, task: Task) -> list[int]:
            made.append(task.id)
            return super().reset(task)

    def make() -> TwoTurnEnv:  # the first group's N members x (1 + infra_retries) tries fail
        return Recorded(broken if len(made) < N * (1 + CFG.infra_retries) else sandbox)

    r = _rollouts(engine, make, fraction=0.75)
    r.start()
    try:
        (group,) = await r.buffer.take(1)
    finally:
        await r.stop()
        await broken.close()
    first = made[0]
    assert made[: N * (1 + CFG.infra_retries)] == [first] * (N * (1 + CFG.infra_retries))
    assert r.buffer.counters.dropped_error == 1 and r.buffer.counters.recycled == 1
    assert group.trajectories[0].task_id == first and group.group_id == "g1"  # the same prompt, sampled again
    assert len(group.trajectories) == N and group.left_out == []
    assert r.counters.infra_failed == {"container_start": N} and r.buffer.last_infra_share == 0.5


async def test_a_run_whose_episodes_all_fail_stops_with_one_line_instead_of_training(engine) -> None:
    broken = sandboxes.create("local", python="/nonexistent/python3")
    r = _rollouts(engine, lambda: TwoTurnEnv(broken), fraction=0.5)
    r.start()
    try:
        with pytest.raises(InfraFailureRate) as caught:
            await r.buffer.take(1)
    finally:
        await r.stop()
        await broken.close()
    # the first dropped group makes 3 of 6 (a clean next batch could still bring it to 50 %), the second 6 of 9
    assert str(caught.value).startswith("6 of the 9 episodes of a batch failed in the infrastructure")
    assert "(container_start 6)" in str(caught.value) and "\n" not in str(caught.value)
    assert r.counters.infra_failed == {"container_start": 6} and r.buffer.counters.delivered_groups == 0
