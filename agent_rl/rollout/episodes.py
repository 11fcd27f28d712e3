"""One episode between an engine and an environment: SimpleTIR turns, or an agent through the gateway.

A turn is sampled with the env's stop strings and budget; when a weight update aborts the request, the
unfinished turn is re-submitted as a continuation (prompt + everything so far, remaining budget) and the
tokens already sampled keep the version that sampled them. The runner is the same wherever it runs: in
the driver (workers.Rollouts, the buffer itself behind `EpisodeBuffer`) or in a rollout process
(shard.py, a proxy of the driver's buffer that reports every change at `update`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from agent_rl.config import RolloutConfig
from agent_rl.engines.api import BadRequest, EngineClient, SamplingParams
from agent_rl.types import FinishReason, Trajectory, TurnInfo


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
    errors: int = 0  # episodes ended by an infrastructure error (FinishReason.ERROR)
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
        self._gateway: Any = None  # agent_rl.gateway.Gateway, made at the first agent episode

    async def close(self) -> None:
        if self._gateway is not None:
            await self._gateway.close()

    async def run(self, group_id: str, task: Any, index: int, traj: Trajectory | None) -> None:
        """Member `index` of `group_id` from the start, or from `traj` (a checkpointed partial episode)."""
        t0 = time.monotonic()
        env = self.make_env()
        prompt_ids = env.reset(task)
        restored = traj is not None
        if traj is None:
            traj = self.buffer.start(group_id, index, prompt_ids)
        try:
            if getattr(env, "is_agent", False):  # an OpenAI-client agent, through the gateway
                finished = await self._run_agent(env, traj)
            else:
                if restored:  # rebuild the env's state from a checkpointed partial episode
                    await self._replay(env, traj)
                finished = await self._run_turns(env, traj)
        except _InfraError as e:
            self.counters.errors += 1
            self.last_error = str(e)
            traj.finish_reason, traj.reward = FinishReason.ERROR, None
            traj.extras["error"] = 1.0
            finished = True
            if self.counters.errors > self.cfg.max_errors:
                self.buffer.fail(RuntimeError(f"{self.counters.errors} episodes failed; last error: {e}"))
        finally:
            await env.close()  # an abandoned or failed episode may still hold a sandbox session
        self.counters.episode_seconds += time.monotonic() - t0
        if finished:
            self.counters.episodes += 1
            self.buffer.finish(traj)
        else:
            self.counters.abandoned += 1
            self.buffer.abandon(traj)

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
                )
                t0 = time.monotonic()
                rid = f"{traj.uid}/{len(traj.turns)}.{len(turn_ids)}"  # unique; a pool sticks by traj.uid
                gen = await self._generate(traj.prompt_ids + traj.response_ids, sampling, rid)
                gen_s += time.monotonic() - t0
                traj.append_sampled(gen.token_ids, gen.logprobs, list(gen.versions))
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
            except Exception as e:  # sandbox or reward worker down: an infrastructure error, not reward 0
                raise _InfraError(f"env.step for {traj.uid} failed: {e!r}") from e
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
                traj.reward = float(result.reward or 0.0)
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
            raise _InfraError(str(e)) from e

    async def _replay(self, env: EpisodeEnv, traj: Trajectory) -> None:
        """Step a fresh env through a restored episode's completed turns (their tokens are kept as stored)."""
        pos, response = 0, traj.response_ids
        for turn in traj.turns:
            try:
                await env.step(response[pos : pos + turn.sampled_tokens], truncated=False)
            except Exception as e:
                raise _InfraError(f"replaying {traj.uid} after resume failed: {e!r}") from e
            pos += turn.sampled_tokens + turn.env_tokens

    async def _generate(self, input_ids: list[int], sampling: SamplingParams, request_id: str):
        """engine.generate with bounded, counted retries on infrastructure errors."""
        for attempt in range(self.cfg.max_retries + 1):
            self.busy.enter()
            try:
                return await self.engine.generate(input_ids, sampling, request_id=request_id)
            except BadRequest as e:  # the request itself is wrong (e.g. too long): retrying cannot help
                raise _InfraError(f"engine refused {request_id}: {e}") from e
            except Exception as e:  # connection lost, engine died or refused: retried, then counted
                if attempt == self.cfg.max_retries:
                    raise _InfraError(f"engine request {request_id} failed {attempt + 1} times: {e!r}") from e
                self.counters.engine_retries += 1
                self.last_error = repr(e)
            finally:
                self.busy.leave()
            await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")


_PENDING = "pending_step_truncated"  # in traj.extras while env.step runs (survives a checkpoint)


class _InfraError(RuntimeError):
    """Engine or sandbox failure after retries: the episode ends with FinishReason.ERROR."""


def _seed(base: int, uid: str, turn: int, offset: int) -> int:
    """A per-request sampling seed: the same episode samples the same tokens in a rerun."""
    digest = hashlib.blake2b(f"{base}:{uid}:{turn}:{offset}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
