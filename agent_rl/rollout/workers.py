"""Rollout workers: asyncio episodes between engines and environments, feeding the buffer.

One task per episode, many in flight. A turn is sampled with the env's stop strings and
budget; when a weight update aborts the request, the unfinished turn is re-submitted as a
continuation (prompt + everything so far, remaining budget) and the tokens already
sampled keep the version that sampled them. The workers run on their own event loop in a
background thread, so the learner's torch step in the main thread overlaps with sampling.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from agent_rl.buffer import RolloutBuffer
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


class PromptSource:
    """The training prompts in a seeded order, epoch after epoch; recycled prompts come first.

    Its cursor (epoch, index) is part of every checkpoint, so a resumed run uses each prompt
    exactly as often as an uninterrupted one.
    """

    def __init__(self, tasks: Iterable[Any], *, seed: int):
        self.tasks = {t.id: t for t in tasks}
        if not self.tasks:
            raise ValueError("the training split has no tasks")
        self.seed = seed
        self.epoch, self.index = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[str]:
        ids = sorted(self.tasks)
        random.Random(f"{self.seed}:{epoch}").shuffle(ids)
        return ids

    def next_id(self, recycled: deque[str]) -> str:
        if recycled:
            return recycled.popleft()
        if self.index == len(self._order):
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        self.index += 1
        return self._order[self.index - 1]

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._shuffled(self.epoch)


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
    agent_splits: int = (
        0  # extra trajectories because a prompt did not extend an earlier call (gateway/assemble.py)
    )
    agent_rerendered: int = 0  # agent prompts rendered in full rather than by the prefix-extension rule
    agent_errors: int = (
        0  # of `errors`: the agent raised (its own bug or a 4xx it did not handle), not an engine
    )


class Rollouts:
    """Runs episodes continuously on a background event loop until stopped."""

    def __init__(
        self,
        cfg: RolloutConfig,
        buffer: RolloutBuffer,
        prompts: PromptSource,
        make_env: Callable[[], EpisodeEnv],
        engine: EngineClient,
        *,
        max_seq_len: int,
        seed: int,
    ):
        self.cfg, self.buffer, self.prompts, self.make_env, self.engine = (
            cfg,
            buffer,
            prompts,
            make_env,
            engine,
        )
        self.max_seq_len, self.seed = max_seq_len, seed
        self.counters = RolloutCounters()
        self.last_error: str | None = None
        self._slots = asyncio.Semaphore(cfg.max_concurrent_episodes)
        self._tasks: set[asyncio.Task] = set()
        self._producer: asyncio.Task | None = None
        self._generating = 0
        self._busy_since = 0.0
        self._snap = (time.monotonic(), RolloutCounters())
        self._gateway: Any = None  # agent_rl.gateway.Gateway, started at the first agent episode

    # -- lifecycle (call on the loop) ---------------------------------------------------
    def start(self) -> None:
        """Resume the buffer's open groups (a restored checkpoint's in-flight work), then admit new prompts."""
        for g in self.buffer.open_groups():
            for i, member in enumerate(g.members):
                if i not in g.reported:
                    self._spawn(self._episode(g.group_id, g.task_id, i, member))
        self._producer = asyncio.create_task(self._produce())
        self._producer.add_done_callback(self._check_crash)

    async def stop(self) -> None:
        tasks = [t for t in [self._producer, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._gateway is not None:
            await self._gateway.close()

    async def _produce(self) -> None:
        while True:
            group_id = await self.buffer.admit(lambda: self.prompts.next_id(self.buffer.recycled))
            task_id = self.buffer.open_task(group_id)
            for i in range(self.buffer.group_size):
                self._spawn(self._episode(group_id, task_id, i, None))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._check_crash)

    def _check_crash(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.buffer.fail(task.exception())  # a bug, not an infrastructure error: stop the run loudly

    # -- one episode --------------------------------------------------------------------
    async def _episode(self, group_id: str, task_id: str, index: int, traj: Trajectory | None) -> None:
        async with self._slots:
            t0 = time.monotonic()
            env = self.make_env()
            prompt_ids = env.reset(self.prompts.tasks[task_id])
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
            gw = Gateway(
                self.engine,
                env.tokenizer,
                max_seq_len=self.max_seq_len,
                tool_parser=env.tool_parser,
                max_retries=self.cfg.max_retries,
                **({"host": ext.host, "port": ext.port} if ext is not None else {}),
            )
            self._gateway = gw
            await gw.start()
            if ext is not None:
                print(f"external agents: claim tasks at POST {gw.url}/tasks/claim", flush=True)
        while self._gateway.url is None:  # another episode is starting it
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
            self._enter_generate()
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
                self._leave_generate()
            await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def _enter_generate(self) -> None:
        if self._generating == 0:
            self._busy_since = time.monotonic()
        self._generating += 1

    def _leave_generate(self) -> None:
        self._generating -= 1
        if self._generating == 0:
            self.counters.engine_busy_seconds += time.monotonic() - self._busy_since

    # -- metrics ------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Counters since the previous call, as rates and means (call once per training step)."""
        now, c = time.monotonic(), self.counters
        busy = c.engine_busy_seconds + (now - self._busy_since if self._generating else 0.0)
        t_prev, p = self._snap
        dt = max(now - t_prev, 1e-9)
        d = {k: v - getattr(p, k) for k, v in vars(c).items()}
        self._snap = (now, RolloutCounters(**{**vars(c), "engine_busy_seconds": busy}))
        eps = max(d["episodes"], 1)
        return {
            "perf/rollout_tokens_per_s": d["sampled_tokens"] / dt,
            "perf/engine_busy_fraction": min(1.0, (busy - p.engine_busy_seconds) / dt),
            "rollout/episodes": c.episodes,
            "rollout/turns_per_episode": d["turns"] / eps,
            "rollout/tool_calls_per_episode": d["tool_calls"] / eps,
            "rollout/tool_error_rate": d["tool_errors"] / max(d["tool_calls"], 1),
            "rollout/episode_seconds": d["episode_seconds"] / eps,
            "rollout/gen_seconds_per_turn": d["gen_seconds"] / max(d["turns"], 1),
            "rollout/tool_seconds_per_turn": d["tool_seconds"] / max(d["turns"], 1),
            "rollout/aborts": c.aborts,
            "rollout/aborted_turn_seconds": d["aborted_turn_seconds"],
            "rollout/engine_retries": c.engine_retries,
            "rollout/errors": c.errors,
            "rollout/abandoned": c.abandoned,
        } | (
            {
                "rollout/agent_calls_per_episode": d["agent_calls"] / eps,
                "rollout/agent_splits": c.agent_splits,  # cumulative; 0 when every agent only appends
                "rollout/agent_rerendered_share": d["agent_rerendered"] / max(d["agent_calls"], 1),
                "rollout/agent_errors": c.agent_errors,
            }
            if c.agent_calls
            else {}
        )


_PENDING = "pending_step_truncated"  # in traj.extras while env.step runs (survives a checkpoint)


class _InfraError(RuntimeError):
    """Engine or sandbox failure after retries: the episode ends with FinishReason.ERROR."""


def _seed(base: int, uid: str, turn: int, offset: int) -> int:
    """A per-request sampling seed: the same episode samples the same tokens in a rerun."""
    digest = hashlib.blake2b(f"{base}:{uid}:{turn}:{offset}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
