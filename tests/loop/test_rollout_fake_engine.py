"""Rollout workers against a FakeEngine (scripted tokens at the EngineClient boundary) and a FakeEnv.

The end-to-end tests in test_train_e2e.py use the real engine, env and sandbox; these pin the
worker's own rules: continuation after abort, versions kept per token, bounded retries, errors
counted and never turned into reward 0.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.engines.api import Generation, SamplingParams
from agent_rl.rollout.workers import PromptSource, Rollouts
from agent_rl.types import FinishReason
from envs.types import StepInfo, StepResult, Task


@dataclass
class FakeEngine:
    """Returns `max_new_tokens` tokens (id 5, log-prob -1) at `version`; scripted aborts and failures."""

    version: int = 0
    abort_first_after: int | None = None  # abort the first request after this many tokens, then bump version
    fail_times: int = 0
    calls: list[tuple[list[int], SamplingParams]] = field(default_factory=list)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        self.calls.append((list(input_ids), sampling))
        await asyncio.sleep(0)
        if self.fail_times:
            self.fail_times -= 1
            raise ConnectionError("engine went away")
        if self.abort_first_after is not None:
            n, self.abort_first_after = self.abort_first_after, None
            out = Generation([5] * n, [-1.0] * n, [self.version] * n, "abort")
            self.version += 1
            return out
        n = sampling.max_new_tokens
        return Generation([5] * n, [-1.0] * n, [self.version] * n, "stop")

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def update_weights(self, *, version: int, path=None, tensors=None) -> None: ...
    async def health(self) -> bool:
        return True

    async def close(self) -> None: ...


class FakeEnv:
    """One turn, budget 6 tokens; reward 1 for any answer; a two-token observation."""

    stop_strings = ("```",)
    max_new_tokens = 6
    group_size = 2

    def reset(self, task: Task) -> list[int]:
        return [1, 2, 3]

    async def step(self, sampled_ids: list[int], *, truncated: bool = False) -> StepResult:
        return StepResult([9, 9], 1.0, True, StepInfo(finish="answer", code_ran=True, exit_code=0))

    async def close(self) -> None: ...


def _rollouts(engine: FakeEngine, k: int = 1, retries: int = 2, max_errors: int = 100) -> Rollouts:
    buf = RolloutBuffer(BufferConfig(max_staleness=k), batch_prompts=1, group_size=2)
    prompts = PromptSource([Task("t0", "1+1", "2"), Task("t1", "2+2", "4")], seed=0)
    cfg = RolloutConfig(max_retries=retries, max_errors=max_errors)
    return Rollouts(cfg, buf, prompts, FakeEnv, engine, max_seq_len=64, seed=0)


async def test_aborted_turn_continues_with_remaining_budget_and_keeps_token_versions() -> None:
    engine = FakeEngine(abort_first_after=2)
    r = _rollouts(engine)
    r.start()
    (group,) = await asyncio.wait_for(r.buffer.take(1), 5)
    await r.stop()
    versions = sorted(t.flatten().versions for t in group.trajectories)
    # one member was interrupted after 2 tokens at version 0 and continued at version 1
    assert [-1, -1, -1, 0, 0, 1, 1, 1, 1, -1, -1] in versions
    cont = next((ids, s) for ids, s in engine.calls if len(ids) == 5)
    assert cont[0] == [1, 2, 3, 5, 5] and cont[1].max_new_tokens == 4
    assert r.counters.aborts == 1


async def test_engine_failure_is_retried_a_bounded_number_of_times_and_counted() -> None:
    r = _rollouts(FakeEngine(fail_times=1))
    r.start()
    (group,) = await asyncio.wait_for(r.buffer.take(1), 5)
    await r.stop()
    assert r.counters.engine_retries == 1 and r.counters.errors == 0
    assert all(t.finish_reason == FinishReason.ANSWER for t in group.trajectories)


async def test_dead_engine_ends_episodes_with_error_never_reward_zero() -> None:
    r = _rollouts(FakeEngine(fail_times=10**6), retries=1)
    r.start()
    for _ in range(200):
        await asyncio.sleep(0.05)
        if r.buffer.counters.dropped_error:
            break
    await r.stop()
    assert r.counters.errors >= 2 and r.counters.engine_retries >= 2
    assert r.buffer.counters.dropped_error >= 1 and r.buffer.counters.delivered_groups == 0
    assert r.buffer.counters.recycled >= 1, "the failed group's prompt must be sampled again"


async def test_restored_partial_episode_continues_where_the_checkpoint_left_it() -> None:
    """A checkpoint taken mid-turn (after an abort) and one taken while the env was stepping."""
    engine = FakeEngine(version=3)
    r = _rollouts(engine, k=8)
    gid = r.buffer.try_admit("t0")
    assert gid is not None
    mid_turn = r.buffer.start(gid, 0, [1, 2, 3])
    mid_turn.append_sampled([5, 5], [-1.0, -1.0], 1)  # aborted after 2 of its 6-token budget
    stepping = r.buffer.start(gid, 1, [1, 2, 3])
    stepping.append_sampled([5] * 6, [-1.0] * 6, 2)
    stepping.extras["pending_step_truncated"] = 0.0  # the env was running this complete turn
    state = r.buffer.state()

    resumed = _rollouts(engine, k=8)
    resumed.buffer.load_state(state)
    resumed.start()
    (group,) = await asyncio.wait_for(resumed.buffer.take(1), 5)
    await resumed.stop()
    a, b = group.trajectories
    assert a.flatten().versions[3:9] == [1, 1, 3, 3, 3, 3]  # 4 more tokens, the rest of the budget
    assert b.flatten().versions[3:9] == [2] * 6 and b.num_sampled == 6  # no token re-sampled
    first_ids, first_sampling = engine.calls[0]  # resumed work is submitted before any new prompt
    assert first_ids == [1, 2, 3, 5, 5] and first_sampling.max_new_tokens == 4
    assert "pending_step_truncated" not in b.extras
