"""One episode between an engine and an environment: SimpleTIR turns, or an agent through the gateway.

A turn is sampled with the env's stop strings and budget; when a weight update aborts the request, the
unfinished turn is re-submitted as a continuation (prompt + everything so far, remaining budget) and the
tokens already sampled keep the version that sampled them. The runner is the same wherever it runs: in
the driver (workers.Rollouts, the buffer itself behind `EpisodeBuffer`) or in a rollout process
(shard.py, a proxy of the driver's buffer that reports every change at `update`).

An infrastructure failure (agent_rl/failures.py: a sandbox or container lost, a verifier that timed out or gave no
reward, a harness that crashed, the engine failing after its retries) runs the episode again from the start,
up to `rollout.infra_retries` times with backoff; one that still fails is reported INFRA_FAILED with its cause,
and the buffer leaves it out of its group.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from agent_rl.config import RolloutConfig
from agent_rl.engines.api import BadRequest, EngineClient, SamplingParams
from agent_rl.failures import EpisodeFailure, backoff_s, check_reward, classify
from agent_rl.types import FinishReason, InfraCause, Trajectory, TurnInfo
from envs.types import InfraFailure
from sandboxes.api import SandboxError

log = logging.getLogger(__name__)


class EpisodeEnv(Protocol):
    """The part of `envs.Env` a rollout worker uses (one Env per episode)."""

    stop_strings: tuple[str, ...] | list[str]
    max_new_tokens: int
    group_size: int

    def reset(self, task: Any) -> list[int]: ...

    async def step(self, sampled_ids: list[int], *, truncated: bool = False) -> Any: ...

    async def close(self) -> None: ...


class EpisodeBuffer(Protocol):
    """What an episode needs of the buffer (agent_rl.buffer.RolloutBuffer implements it)."""

    def start(self, group_id: str, index: int, prompt_ids: list[int]) -> Trajectory: ...

    def doomed(self, group_id: str) -> bool: ...

    def update(self, traj: Trajectory) -> None:
        """The episode changed `traj` and is about to wait (on the engine, the sandbox or the agent)."""

    def finish(self, traj: Trajectory) -> None: ...

    def abandon(self, traj: Trajectory) -> None: ...

    def fork(self, member: Trajectory, n: int) -> Trajectory: ...

    def drop_forks(self, member: Trajectory) -> None: ...

    def fail(self, error: BaseException) -> None: ...


@dataclass
class RolloutCounters:
    episodes: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0  # code ran and exited non-zero or timed out (an observation, not a failure)
    aborts: int = 0  # turns interrupted by a weight update and continued
    aborted_turn_seconds: float = 0.0  # generation wall time of those turns (abort and continuation included)
    engine_retries: int = 0
    errors: int = 0  # episodes left out as infrastructure failures after their retries (INFRA_FAILED)
    infra_retries: int = 0  # episodes run again from the start after an infrastructure failure
    infra_failed: Counter[InfraCause] = field(default_factory=Counter)  # `errors` by cause (cumulative)
    abandoned: int = 0  # episodes stopped because their group went over the staleness bound
    sampled_tokens: int = 0
    episode_seconds: float = 0.0
    gen_seconds: float = 0.0
    tool_seconds: float = 0.0
    engine_busy_seconds: float = 0.0  # wall time with at least one generate request in flight
    agent_calls: int = 0  # chat completions of agent episodes (type: agent envs)
    # extra trajectories because a prompt did not extend an earlier call (gateway/assemble.py)
    agent_splits: int = 0
    agent_rerendered: int = 0  # agent prompts rendered in full rather than by the prefix-extension rule
    agent_errors: int = 0  # of `errors`: the agent raised (its bug, or a 4xx it did not handle), no engine
    # sampled under a constraint by an engine that reports no unmasked log-probs: the masked ones are log mu
    constrained_masked_fallback_tokens: int = 0

    def __add__(self, other: RolloutCounters) -> RolloutCounters:
        return RolloutCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


class BusyClock:
    """Wall time with at least one engine request in flight."""

    def __init__(self) -> None:
        self.seconds, self._n, self._since = 0.0, 0, 0.0

    def enter(self) -> None:
        if self._n == 0:
            self._since = time.monotonic()
        self._n += 1

    def leave(self) -> None:
        self._n -= 1
        if self._n == 0:
            self.seconds += time.monotonic() - self._since

    def total(self) -> float:
        """Busy seconds so far, the request in flight now included."""
        return self.seconds + (time.monotonic() - self._since if self._n else 0.0)


class EpisodeRunner:
    """Runs episodes against `engine`, reporting to `buffer`; counts what happens in `counters`."""

    def __init__(
        self,
        cfg: RolloutConfig,
        buffer: EpisodeBuffer,
        make_env: Callable[[], EpisodeEnv],
        engine: EngineClient,
        *,
        max_seq_len: int,
        seed: int,
    ):
        self.cfg, self.buffer, self.make_env, self.engine = cfg, buffer, make_env, engine
        self.max_seq_len, self.seed = max_seq_len, seed
        self.counters = RolloutCounters()
        self.busy = BusyClock()
        self.last_error: str | None = None
        # set when the run ends: the engines close before the episodes are cancelled (runtime._shutdown), and an
        # episode that meets the closed engine in between ends as cancelled, not as an infrastructure failure
        self.stopping = False
        self._gateway: Any = None  # agent_rl.gateway.Gateway, made at the first agent episode

    async def close(self) -> None:
        if self._gateway is not None:
            await self._gateway.close()

    async def run(self, group_id: str, task: Any, index: int, traj: Trajectory | None) -> None:
        """Member `index` of `group_id` from the start, or from `traj` (a checkpointed partial episode).

        An infrastructure failure runs the episode again from the start (a fresh env) after a backoff, up to
        `infra_retries` times; one that still fails is reported finished as INFRA_FAILED with its cause."""
        t0 = time.monotonic()
        restored = traj is not None
        finished, failure = False, None
        for attempt in range(self.cfg.infra_retries + 1):
            if failure is not None:  # the previous attempt failed: wait, then start over
                if not failure.retry or (traj is not None and self.buffer.doomed(traj.group_id)):
                    break
                self.counters.infra_retries += 1
                await asyncio.sleep(backoff_s(self.cfg, attempt))
            failure, env = None, self.make_env()
            try:
                try:
                    prompt_ids = env.reset(task)
                except (InfraFailure, SandboxError) as e:  # e.g. its container did not start
                    raise classify(e, f"env.reset for {group_id}/{index}") from e
                if traj is None:
                    traj = self.buffer.start(group_id, index, prompt_ids)
                elif attempt:
                    _start_over(traj, prompt_ids)
                    self.buffer.drop_forks(traj)  # an agent episode's split-off trajectories
                    self.buffer.update(traj)
                if getattr(env, "is_agent", False):  # an OpenAI-client agent, through the gateway
                    finished = await self._run_agent(env, traj)
                else:
                    if restored and not attempt:  # rebuild the env's state from a checkpointed episode
                        await self._replay(env, traj)
                    finished = await self._run_turns(env, traj)
            except EpisodeFailure as e:
                if self.stopping:  # the run is ending: no retry, no infra_failed line, no error counted
                    raise asyncio.CancelledError from e
                failure = e
                self.last_error = str(e)
            finally:
                try:
                    await env.close()  # an abandoned or failed episode may still hold a sandbox session
                except Exception:
                    if failure is None:
                        raise
                    # closing what already failed (a killed sandbox) fails too: the failure is reported
            if failure is None:
                break
        if failure is not None:
            if traj is None:  # never started: reported with no tokens, so its group can resolve
                traj = self.buffer.start(group_id, index, [])
            # a doomed group (over the staleness bound) is dropped as stale anyway: the episode is abandoned
            finished = not self.buffer.doomed(traj.group_id)
            if finished:
                self._give_up(traj, failure)
        assert traj is not None
        self.counters.episode_seconds += time.monotonic() - t0
        if finished:
            self.counters.episodes += 1
            self.buffer.finish(traj)
        else:
            self.counters.abandoned += 1
            self.buffer.abandon(traj)

    def _give_up(self, traj: Trajectory, failure: EpisodeFailure) -> None:
        """Mark `traj` INFRA_FAILED with the failure's cause (no reward: never 0)."""
        self.counters.errors += 1
        self.counters.infra_failed[failure.cause] += 1
        log.warning(
            "infra_failed: %s left out of its group after %d retries: %s",
            traj.uid,
            self.cfg.infra_retries,
            failure,
        )
        _start_over(traj, traj.prompt_ids)  # the failed try's tokens are not trained on
        traj.finish_reason, traj.infra_cause = FinishReason.INFRA_FAILED, failure.cause
        traj.extras["error"] = 1.0
        self.buffer.drop_forks(traj)
        cap = self.cfg.max_errors
        if cap is not None and self.counters.errors > cap:
            self.buffer.fail(RuntimeError(f"{self.counters.errors} episodes failed; last error: {failure}"))

    async def _run_turns(self, env: EpisodeEnv, traj: Trajectory) -> bool:
        """Sample turns and step the env until done; False if the group went over the bound first."""
        while True:
            done_so_far = sum(t.sampled_tokens + t.env_tokens for t in traj.turns)
            turn_ids = traj.response_ids[done_so_far:]  # a checkpointed partial turn continues here
            budget = env.max_new_tokens - len(turn_ids)
            aborts, gen_s = 0, 0.0
            # a checkpoint taken while the env was stepping: the turn's sampling is already complete
            pending = traj.extras.pop(_PENDING, None)
            finish = "length" if pending is None or pending else "stop"
            while budget > 0 and pending is None:
                room = self.max_seq_len - len(traj)
                if room <= 0:
                    break
                self.buffer.update(traj)
                if self.buffer.doomed(traj.group_id):
                    return False
                sampling = SamplingParams(
                    temperature=self.cfg.temperature,
                    top_p=self.cfg.top_p,
                    top_k=self.cfg.top_k,
                    max_new_tokens=min(budget, room),
                    stop=tuple(env.stop_strings),
                    seed=_seed(self.seed, traj.uid, len(traj.turns), len(turn_ids)),
                    return_routed_experts=True,  # MoE engines report routing (replay, routing agreement)
                )
                t0 = time.monotonic()
                rid = f"{traj.uid}/{len(traj.turns)}.{len(turn_ids)}"  # unique; a pool sticks by traj.uid
                gen = await self._generate(traj.prompt_ids + traj.response_ids, sampling, rid)
                gen_s += time.monotonic() - t0
                traj.append_sampled(gen.token_ids, gen.logprobs, list(gen.versions))
                traj.set_routed_experts(gen.routed_experts)
                turn_ids += gen.token_ids
                budget -= len(gen.token_ids)
                self.counters.sampled_tokens += len(gen.token_ids)
                finish = gen.finish_reason
                if finish != "abort":
                    break
                aborts += 1
            self.counters.aborts += aborts
            self.counters.aborted_turn_seconds += gen_s if aborts else 0.0
            if self.buffer.doomed(traj.group_id):
                return False
            t0 = time.monotonic()
            traj.extras[_PENDING] = float(finish != "stop")
            self.buffer.update(traj)
            try:
                result = await env.step(turn_ids, truncated=finish != "stop")
            except Exception as e:  # sandbox, container or verifier down: an infrastructure failure, not 0
                raise classify(e, f"env.step for {traj.uid}") from e
            del traj.extras[_PENDING]
            info = result.info
            traj.turns.append(
                TurnInfo(
                    sampled_tokens=len(turn_ids),
                    env_tokens=len(result.observation_ids),
                    code_ran=info.code_ran,
                    exit_code=info.exit_code,
                    timed_out=info.timed_out,
                    gen_seconds=gen_s,
                    tool_seconds=time.monotonic() - t0,
                    aborts=aborts,
                )
            )
            traj.append_env(result.observation_ids)
            self.counters.turns += 1
            self.counters.tool_calls += int(info.code_ran)
            self.counters.tool_errors += int(info.code_ran and (info.timed_out or (info.exit_code or 0) != 0))
            self.counters.gen_seconds += gen_s
            self.counters.tool_seconds += info.tool_seconds
            if result.done:
                if info.reward_timed_out:  # the verifier was killed past its limit: no verdict, not a 0
                    raise EpisodeFailure(
                        "verifier_timeout", f"env.step for {traj.uid}: the reward's verifier timed out"
                    )
                traj.reward = check_reward(result.reward, f"env.step for {traj.uid}")
                traj.finish_reason = FinishReason(info.finish or "length")
                traj.masked = info.masked
                return True

    async def _run_agent(self, env: Any, traj: Trajectory) -> bool:
        from agent_rl.gateway.episode import AgentEpisodeError, run_agent_episode
        from agent_rl.gateway.server import Gateway

        if self._gateway is None:
            ext = env.spec.external
            gw = self._gateway = Gateway(
                self.engine,
                env.tokenizer,
                max_seq_len=self.max_seq_len,
                tool_parser=env.tool_parser,
                reasoning_parser=env.reasoning_parser,
                max_retries=self.cfg.max_retries,
                **({"host": ext.host, "port": ext.port} if ext is not None else {}),
            )
            if ext is not None:  # agents in other processes reach it over HTTP (ours: gw.client, no socket)
                await gw.start()
                print(f"external agents: claim tasks at POST {gw.url}/tasks/claim", flush=True)
        while env.spec.external is not None and self._gateway.url is None:  # another episode is starting it
            await asyncio.sleep(0.01)
        try:
            return await run_agent_episode(
                self._gateway, env, traj, self.buffer, self.cfg, self.counters, seed=self.seed
            )
        except AgentEpisodeError as e:
            raise EpisodeFailure(e.cause, str(e)) from e

    async def _replay(self, env: EpisodeEnv, traj: Trajectory) -> None:
        """Step a fresh env through a restored episode's completed turns (their tokens are kept as stored)."""
        pos, response = 0, traj.response_ids
        for turn in traj.turns:
            try:
                await env.step(response[pos : pos + turn.sampled_tokens], truncated=False)
            except Exception as e:
                raise classify(e, f"replaying {traj.uid} after resume") from e
            pos += turn.sampled_tokens + turn.env_tokens

    async def _generate(self, input_ids: list[int], sampling: SamplingParams, request_id: str):
        """engine.generate with bounded, counted retries on infrastructure errors."""
        for attempt in range(self.cfg.max_retries + 1):
            self.busy.enter()
            try:
                return await self.engine.generate(input_ids, sampling, request_id=request_id)
            except BadRequest as e:  # the request itself is wrong (e.g. too long): retrying cannot help
                raise EpisodeFailure("engine", f"engine refused {request_id}: {e}", retry=False) from e
            except Exception as e:  # connection lost, engine died or refused: retried, then counted
                if attempt == self.cfg.max_retries:
                    raise EpisodeFailure(
                        "engine", f"engine request {request_id} failed {attempt + 1} times: {e!r}"
                    ) from e
                self.counters.engine_retries += 1
                self.last_error = repr(e)
            finally:
                self.busy.leave()
            await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")


_PENDING = "pending_step_truncated"  # in traj.extras while env.step runs (survives a checkpoint)


def _start_over(traj: Trajectory, prompt_ids: list[int]) -> None:
    """Empty `traj` in place (the buffer holds this object) for a fresh try of its episode."""
    traj.prompt_ids, traj.segments, traj.turns, traj.extras = list(prompt_ids), [], [], {}
    traj.reward, traj.finish_reason, traj.infra_cause, traj.masked = None, None, None, False
    traj.routed_experts, traj.teacher_logprobs = None, None


def _seed(base: int, uid: str, turn: int, offset: int) -> int:
    """A per-request sampling seed: the same episode samples the same tokens in a rerun."""
    digest = hashlib.blake2b(f"{base}:{uid}:{turn}:{offset}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
