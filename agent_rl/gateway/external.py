"""Sessions over HTTP, and agents in other processes or machines that a training run hands its tasks to.

Routes (on the gateway's port; `agent-rl gateway` and a training run with a `type: external` env serve them):

    POST /sessions              {session_id?, seed?, sampling?: {temperature, top_p, top_k},
                                 limits?: {max_calls, max_tokens_per_call, max_sampled_tokens}}
                                -> {session_id, base_url, api_key}  (an OpenAI endpoint for this session, its token)
    POST /tasks/claim           {wait_s?: 0..60} -> {session_id, base_url, api_key, task: {id, problem, numbers}} | 204
    POST /sessions/{id}/close   {reward?: float | answer?: str | error?: str}
                                -> a claimed task: {session_id, accepted: true}; the run scores and trains it
                                -> an opened session: {session_id, reward, calls, splits, trajectories: [...]}

A claimed task's session samples with the run's `rollout` settings and the env's `turns` budgets, its
group's staleness bound stops it (the agent's next call is a 410), its calls are continued across weight
updates (each token keeps the version that sampled it), and the run trains what it recorded, exactly as an
in-process `type: agent` episode (gateway/episode.py). A task not claimed and closed within the env's
`external.timeout_s` ends as an error and is sampled again.

Keys (access.py): opening a session takes the gateway's key; a claim takes the external agents' key
($AGENT_RL_EXTERNAL_AGENT_KEY) and answers the session's `api_key`, a token that opens that session's routes
(its OpenAI endpoint, its close) and nothing else, so an agent can close and score only the tasks it claimed.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.engines.api import SamplingParams
from agent_rl.gateway.assemble import assemble
from agent_rl.gateway.record import SessionLimits
from agent_rl.openai.errors import error, parse


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingBody(_Body):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1


class LimitsBody(_Body):
    max_calls: int | None = Field(None, ge=1)
    max_tokens_per_call: int | None = Field(None, ge=1)
    max_sampled_tokens: int | None = Field(None, ge=1)


class OpenBody(_Body):
    session_id: str | None = None
    seed: int = 0
    sampling: SamplingBody | None = None
    """Forced on every call (the agent's own temperature/top_p are ignored); None: the agent's."""
    limits: LimitsBody = LimitsBody()


class ClaimBody(_Body):
    wait_s: float = Field(0.0, ge=0)
    """How long to wait for a task (at most 60 s); 0: answer at once (204 when none is pending)."""


class CloseBody(_Body):
    reward: float | None = None
    answer: str | None = None
    error: str | None = (
        None  # the agent failed: the episode ends as an error (sampled again), not as reward 0
    )

    @model_validator(mode="after")
    def _one(self):
        given = [k for k in ("reward", "answer", "error") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of reward, answer, error; got {given}")
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError(f"reward must be finite, got {self.reward}")
        return self


class RunOver(RuntimeError):
    """The gateway is closing with its run: no task will be handed out any more (410 to a claim)."""


class ExternalAgentError(RuntimeError):
    """The external agent reported an error, or did not claim and close its task in time."""


@dataclass
class Claim:
    sid: str
    task: Any  # envs.Task
    done: asyncio.Future
    claimed: bool = False


@dataclass
class Board:
    """Tasks waiting for an external agent, and the sessions of tasks claimed (one per episode)."""

    pending: deque[Claim] = field(default_factory=deque)
    by_sid: dict[str, Claim] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0  # claims parked until a task comes
    closed: bool = False  # the run is over: every claim, waiting or new, is answered 410

    def close(self) -> None:
        """The run ended: wake every waiting claim (each answers 410, and the agent stops) and refuse new ones."""
        self.closed = True
        self.wake.set()

    async def run(self, env: Any, sid: str, timeout_s: float, should_stop: Callable[[], bool]) -> Any:
        """Post the env's task, wait for its session to be closed; the episode's outcome (envs.agent.AgentOutcome)."""
        from envs.agent import AgentOutcome

        loop = asyncio.get_running_loop()
        item = Claim(sid, env.task, loop.create_future())
        self.pending.append(item)
        self.by_sid[sid] = item
        self.wake.set()
        deadline = loop.time() + timeout_s
        try:
            while not item.done.done():
                if should_stop():
                    raise ExternalAgentError(
                        f"task of session {sid} abandoned: its group went over the bound"
                    )
                if loop.time() > deadline:
                    what = "closed" if item.claimed else "claimed"
                    raise ExternalAgentError(
                        f"session {sid}: no external agent {what} its task in {timeout_s:g} s"
                    )
                await asyncio.wait({item.done}, timeout=min(1.0, max(deadline - loop.time(), 0.01)))
        finally:
            self.by_sid.pop(sid, None)
            if not item.claimed:
                self.pending.remove(item)
        body: CloseBody = item.done.result()
        if body.error is not None:
            raise ExternalAgentError(f"session {sid}: the external agent failed: {body.error}")
        if body.reward is not None:
            return AgentOutcome(body.reward, None)
        return AgentOutcome(await env.score(body.answer), body.answer)

    async def claim(self, wait_s: float) -> Claim | None:
        """The next pending task, waiting up to `wait_s` for one; None if none came. Raises RunOver once closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            if self.closed:
                raise RunOver("the training run has ended: there are no more tasks to claim")
            while self.pending:
                item = self.pending.popleft()
                if item.sid in self.by_sid:  # not abandoned meanwhile
                    item.claimed = True
                    return item
            left = deadline - loop.time()
            if left <= 0:
                return None
            self.wake.clear()
            self.waiting += 1
            try:
                await asyncio.wait_for(self.wake.wait(), left)
            except TimeoutError:
                return None
            finally:
                self.waiting -= 1


# -- routes -------------------------------------------------------------------------------
def add_session_routes(app: web.Application, key: web.AppKey) -> None:
    async def open_session(request: web.Request) -> web.Response:
        gw = request.app[key]
        body = await parse(request, OpenBody)
        sid = body.session_id or uuid.uuid4().hex
        sampling = None if body.sampling is None else SamplingParams(**body.sampling.model_dump())
        gw.open(sid, seed=body.seed, sampling=sampling, limits=SessionLimits(**body.limits.model_dump()))
        token = gw.sessions[sid].token
        return web.json_response({"session_id": sid, "base_url": gw.base_url(sid), "api_key": token})

    async def claim(request: web.Request) -> web.Response:
        gw = request.app[key]
        body = await parse(request, ClaimBody)
        try:
            item = await gw.board.claim(min(body.wait_s, 60.0))
        except RunOver as e:  # the agent's cue to stop (examples/external_agent exits 0 on it)
            return error(410, str(e), param=None, code="run_ended")
        if item is None:
            return web.Response(status=204)
        task = {"id": item.task.id, "problem": item.task.problem, "numbers": list(item.task.numbers)}
        token = gw.session(item.sid).token  # the only key to this task's session and its close
        return web.json_response(
            {"session_id": item.sid, "base_url": gw.base_url(item.sid), "api_key": token, "task": task}
        )

    async def close(request: web.Request) -> web.Response:
        gw = request.app[key]
        sid = request.match_info["sid"]
        body = await parse(request, CloseBody)
        claimed = gw.board.by_sid.get(sid)
        if claimed is not None:  # a training run's task: the episode closes the session and trains it
            if not claimed.claimed:
                return error(409, f"session {sid}: its task was not claimed", param="session")
            if claimed.done.done():
                return error(409, f"session {sid} is already closed", param="session")
            claimed.done.set_result(body)
            return web.json_response({"session_id": sid, "accepted": True})
        gw.session(sid)  # 404 if unknown
        s = gw.close_session(sid)
        trajectories, splits = assemble(s.calls, uid=sid, group_id=sid)
        out = {
            "session_id": sid,
            "reward": body.reward,
            "answer": body.answer,
            "calls": s.stats.calls,
            "splits": splits,
            "trajectories": [_flat(t) for t in trajectories],
        }
        if gw.record_path is not None:
            with Path(gw.record_path).open("a") as f:
                f.write(json.dumps(out) + "\n")
        return web.json_response(out)

    app.router.add_post("/sessions", open_session)
    app.router.add_post("/tasks/claim", claim)
    app.router.add_post("/sessions/{sid}/close", close)


def _flat(t: Any) -> dict:
    f = t.flatten()
    return {
        "uid": t.uid,
        "input_ids": f.input_ids,
        "loss_mask": f.loss_mask,
        "logprobs": f.behavior_logprobs,
        "versions": f.versions,
    }
