"""One agent episode inside the async training loop (called by `rollout.episodes.EpisodeRunner` for agent envs).

The buffer's member trajectory is grown live from the gateway's recorded calls (assemble.py), so
the staleness bound sees its versions while the agent runs; a split starts a fork that the buffer
delivers with the group, all sharing the episode's reward. A group that goes over the bound stops
the session (the agent's next call gets a 410 Gone) and the episode is abandoned like any other. An
episode interrupted by a checkpoint restarts from scratch on resume: an agent's Python state cannot
be saved. Engine failures after retries and the gateway's own errors (500) are infrastructure failures of
cause `engine`, an agent that raises one of `harness_crash` (or the cause of the InfraFailure or SandboxError
it let through), an external agent that never closes its task one of `harness_timeout`: the episode is retried,
then left out of its group, never scored 0 (agent_rl/failures.py); an agent that runs out of
budget (410) without handling it, or raises right after a reply cut by the per-call token budget, scores 0 with finish reason `length`.
"""

from __future__ import annotations

from typing import Any

from agent_rl.engines.api import SamplingParams
from agent_rl.failures import classify
from agent_rl.gateway.assemble import Assembler
from agent_rl.gateway.external import ExternalAgentError
from agent_rl.gateway.record import Call
from agent_rl.gateway.server import Gateway, SessionLimits
from agent_rl.types import FinishReason, InfraCause, Trajectory, TurnInfo
from envs.types import InfraFailure
from sandboxes.api import SandboxError


class AgentEpisodeError(RuntimeError):
    """The engines failed after retries, or the agent itself raised: an infrastructure failure of `cause`."""

    def __init__(self, message: str, cause: InfraCause = "harness_crash") -> None:
        super().__init__(message)
        self.cause = cause


async def run_agent_episode(
    gateway: Gateway,
    env: Any,  # envs.agent.AgentEnv
    traj: Trajectory,
    buffer: Any,  # rollout.episodes.EpisodeBuffer (doomed, update, fork, drop_forks)
    cfg: Any,  # agent_rl.config.RolloutConfig (temperature, top_p, top_k)
    counters: Any,  # agent_rl.rollout.episodes.RolloutCounters
    *,
    seed: int,
) -> bool:
    """Run the agent; True when the episode finished (reward set on every trajectory), False if abandoned."""
    traj.prompt_ids, traj.segments, traj.turns, traj.reward, traj.finish_reason = [], [], [], None, None
    buffer.drop_forks(traj)  # a restart after resume: the earlier attempt's forks are void
    forks: list[Trajectory] = []

    def fork() -> Trajectory:
        forks.append(buffer.fork(traj, len(forks) + 1))
        return forks[-1]

    asm = Assembler(traj, fork, cfg.constrained_logprobs)
    runs_at_call: list[int] = []

    def on_call(call: Call) -> None:
        runs_at_call.append(len(env.sandbox.runs) if env.sandbox is not None else 0)
        buffer.update(asm.add(call))

    turns = env.spec.turns
    sid = traj.uid.replace("/", "-")
    session = gateway.open(
        sid,
        sampling=SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k),
        limits=SessionLimits(
            max_calls=turns.max_turns,
            max_tokens_per_call=turns.max_tokens_per_turn,
            max_sampled_tokens=turns.max_response_tokens,
        ),
        seed=seed,
        on_call=on_call,
        should_stop=lambda: buffer.doomed(traj.group_id),
    )
    client = None
    who = env.spec.agent.import_path if env.spec.agent is not None else "the external agent"
    finish, reward = FinishReason.ANSWER, 0.0
    try:
        if env.external:  # an agent in another process claims the task over HTTP (external.py)
            stop = lambda: buffer.doomed(traj.group_id)  # noqa: E731
            outcome = await gateway.board.run(env, sid, env.spec.external.timeout_s, stop)
        else:
            await gateway.ensure_started()  # an agent may open its own client from client.base_url
            client = gateway.client(sid)  # the official client, served in this process (gateway/inprocess.py)
            outcome = await env.run(client)
        reward = outcome.reward
    except Exception as e:
        if buffer.doomed(traj.group_id):
            return False
        if session.stats.errors:
            raise AgentEpisodeError(f"episode {traj.uid}: {session.stats.errors[-1]}", "engine") from e
        if isinstance(e, InfraFailure | SandboxError):  # the agent's tools lost their sandbox or container
            raise AgentEpisodeError(f"episode {traj.uid}: {e}", classify(e, who).cause) from e
        if isinstance(e, ExternalAgentError) and "no external agent" in str(e):
            raise AgentEpisodeError(f"episode {traj.uid}: {e}", "harness_timeout") from e
        cut = bool(session.calls) and session.calls[-1].finish_reason == "length"
        if session.over is None and not cut:
            counters.agent_errors += 1
            why = f" after a 4xx ({session.stats.client_errors[-1]})" if session.stats.client_errors else ""
            raise AgentEpisodeError(
                f"episode {traj.uid}: agent {who} raised {e!r}{why}; fix the agent"
            ) from e
        # the budget ran out and the agent did not handle the 410, or it raised on a reply its token budget cut
        # (the Agents SDK's Responses model raises on `incomplete`): the model's doing, scored 0
        finish = FinishReason.LENGTH
    finally:
        gateway.close_session(sid)
        if client is not None:
            await client.close()
    if buffer.doomed(traj.group_id):
        return False
    if not asm.trajectories:
        raise AgentEpisodeError(f"episode {traj.uid}: agent {who} made no chat completion")
    runs = len(env.sandbox.runs) if env.sandbox is not None else 0
    after = runs_at_call[1:] + [runs]
    traj.turns = [
        TurnInfo(
            sampled_tokens=len(c.token_ids),
            code_ran=after[i] > runs_at_call[i],
            gen_seconds=c.seconds,
            aborts=c.aborts,
        )
        for i, c in enumerate(session.calls)
    ]
    for t in asm.trajectories:
        t.reward, t.finish_reason = reward, finish
    traj.extras["agent_splits"] = float(asm.splits)
    counters.turns += len(session.calls)
    counters.tool_calls += runs
    counters.tool_errors += (
        sum(1 for r in env.sandbox.runs if r.timed_out or (r.exit_code or 0) != 0) if runs else 0
    )
    counters.aborts += session.stats.aborts
    counters.sampled_tokens += session.stats.sampled_tokens
    counters.gen_seconds += session.stats.gen_seconds
    counters.tool_seconds += sum(r.seconds for r in env.sandbox.runs) if runs else 0.0
    counters.agent_calls += len(session.calls)
    counters.agent_splits += asm.splits
    counters.agent_rerendered += session.stats.rerendered
    counters.constrained_masked_fallback_tokens += sum(c.masked_fallback for c in session.calls)
    return True
