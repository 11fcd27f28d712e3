"""Agent environments (`type: agent`): an async function written against the OpenAI client runs each episode.

    async def run(task: envs.Task, client: openai.AsyncOpenAI, sandbox: envs.agent.AgentSandbox, **kwargs):
        ...  # chat.completions.create(..., tools=[...]) as against OpenAI; sandbox.run(code) for a python tool
        return final_answer_text        # scored by the env's reward; or return a float reward

The env owns data, the entrypoint, the sandbox and the reward; the training side (agent_rl/gateway) owns
the client: it binds it to the episode's gateway session, which records every call as token ids.
Nothing here imports agent_rl (dependencies point agent_rl -> envs).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envs import rewards
from envs.datasets import DatasetReport, env_split
from envs.loop_resources import shared_mcp_server
from envs.spec import EnvSpec, load_callable
from envs.tir import tool_output
from envs.types import EnvError, Task
from envs.verify_pool import default_pool


@dataclass(frozen=True)
class ToolRun:
    exit_code: int | None
    timed_out: bool
    seconds: float


@dataclass
class AgentSandbox:
    """What an agent's python tool calls: runs code under the env's limits; returns what the model should see
    (stdout, or the last line of stderr on failure, as in SimpleTIR). One interpreter session per episode when
    `tool.session` is set."""

    spec: EnvSpec
    limits: Any
    sandbox: Any
    runs: list[ToolRun] = field(default_factory=list)
    _session: Any = None

    async def run(self, code: str) -> str:
        start = time.perf_counter()
        if self.spec.tool.session:
            if self._session is None:
                self._session = self.sandbox.session(limits=self.limits)
            res = await self._session.run(code, limits=self.limits)
        else:
            res = await self.sandbox.run(code, limits=self.limits)
        self.runs.append(ToolRun(res.exit_code, res.timed_out, time.perf_counter() - start))
        obs = self.spec.tool.observation
        return tool_output(
            res.stdout,
            res.stderr,
            res.exit_code,
            res.timed_out,
            res.oom_killed,
            self.limits.timeout_s,
            obs.on_error,
            obs.empty,
        )

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


@dataclass(frozen=True)
class AgentOutcome:
    reward: float
    answer: str | None  # the agent's final answer, when it returned one


class AgentEnv:
    """One agent episode (make one per episode with envs.make). `run(client)` after `reset(task)`."""

    is_agent = True
    stop_strings: tuple[str, ...] = ()

    def __init__(
        self,
        spec: EnvSpec,
        tokenizer: Any,
        sandbox: Any,
        entrypoint: Any,
        reward_fn: Any,
        limits: Any,
        shared_sandbox: Callable[[], Any],
    ):
        self.spec, self.tokenizer, self._entry, self._reward_fn = spec, tokenizer, entrypoint, reward_fn
        self.external = spec.external is not None  # run by an agent in another process (gateway/external.py)
        cfg = spec.agent or spec.external or spec.verifiers
        self.tool_parser, self.reasoning_parser = cfg.tool_parser, cfg.reasoning_parser
        self._sandbox_backend, self._limits, self._shared_sandbox = sandbox, limits, shared_sandbox
        self._task: Task | None = None
        self.sandbox: AgentSandbox | None = None
        self._mcp: Any = None  # sandboxes.mcp_server.McpToolServer serving this episode's sandbox
        self._mcp_id: str | None = None

    # -- what rollout workers read ----------------------------------------------------
    @property
    def task(self) -> Task:
        if self._task is None:
            raise EnvError("reset() first")
        return self._task

    @property
    def group_size(self) -> int:
        return self.spec.group_size

    @property
    def max_new_tokens(self) -> int:
        return self.spec.turns.max_tokens_per_turn

    def tasks(self, split: str) -> tuple[Task, ...]:
        return self._split(split)[0]

    def data_report(self, split: str) -> DatasetReport:
        return self._split(split)[1]

    def _split(self, split: str) -> tuple[tuple[Task, ...], DatasetReport]:
        """The split's tasks and data report; envs whose tasks come from elsewhere (verifiers_env.py) override it."""
        return env_split(self.spec, split)

    # -- episode ------------------------------------------------------------------------
    def reset(self, task: Task) -> list[int]:
        """Remember the task; the prompt ids come from the agent's first chat completion, so none here."""
        self._task = task
        return []

    async def run(self, client: Any) -> AgentOutcome:
        """Run the agent on the task with `client`; score what it returns."""
        if self._task is None:
            raise EnvError("run() before reset()")
        if self._sandbox_backend is None:
            self._sandbox_backend = self._shared_sandbox()
        self.sandbox = AgentSandbox(self.spec, self._limits, self._sandbox_backend)
        assert self.spec.agent is not None
        kwargs = dict(self.spec.agent.kwargs)
        if self.spec.agent.mcp_servers:
            kwargs["mcp_servers"] = await self._mcp_urls(getattr(client, "api_key", None))
        out = await self._entry(self._task, client, self.sandbox, **kwargs)
        if isinstance(out, bool) or not isinstance(out, (int, float, str, type(None))):
            raise EnvError(
                f"agent {self.spec.agent.import_path} returned {type(out).__name__}; "
                "return the reward (a number) or the final answer (a string, or None for no answer)"
            )
        if isinstance(out, (int, float)):
            if not math.isfinite(out):
                raise EnvError(
                    f"agent {self.spec.agent.import_path} returned reward {out}; rewards must be finite"
                )
            return AgentOutcome(float(out), None)
        return AgentOutcome(await self.score(out), out)

    async def _mcp_urls(self, token: str | None) -> dict[str, str]:
        """name -> URL of each MCP server in `agent.mcp_servers`; the sandbox one is this episode's (unique URL),
        opened by `token` (the episode's session token, its client's api_key) as well as the run's key."""
        urls: dict[str, str] = {}
        for server in self.spec.agent.mcp_servers:
            if server.url is not None:
                urls[server.name] = server.url
                continue
            self._mcp = await shared_mcp_server()
            self._mcp_id = self._mcp_id or uuid.uuid4().hex
            urls[server.name] = self._mcp.register(self._mcp_id, self.sandbox.run, token)
        return urls

    async def score(self, answer: str | None) -> float:
        """The env's reward for a final answer text (a \\boxed{} in it wins over the whole text)."""
        task, r = self._task, self.spec.reward
        assert task is not None
        if answer is None:
            return 0.0
        if r.type == "callable":
            value = float(self._reward_fn(answer, task, **r.kwargs))
            if not math.isfinite(value):
                raise EnvError(
                    f"reward {r.import_path} returned {value} for task {task.id}; rewards must be finite"
                )
            return value
        if r.type == "countdown":
            expr = rewards.countdown_expression(answer)
            return rewards.countdown_score(expr, task.numbers, task.answer)
        final = rewards.last_boxed(answer) or answer.strip()
        if r.type == "integer":
            return float(rewards.integer_match(final, task.answer))
        verdict = await default_pool().verify(final, task.answer, timeout_s=r.timeout_s)
        return float(verdict.correct)

    async def close(self) -> None:
        if self._mcp is not None:
            self._mcp.unregister(self._mcp_id)
        if self.sandbox is not None:
            await self.sandbox.close()


def make_agent_env(
    spec: EnvSpec, tokenizer: Any, sandbox: Any, limits: Any, shared_sandbox: Callable[[], Any]
) -> AgentEnv:
    """Called by envs.make for `type: agent` and `external` (sandbox None: `shared_sandbox()` at the first run)."""
    near = spec.source_path
    entry = load_callable(spec.agent.import_path, near=near) if spec.agent is not None else None
    reward_fn = load_callable(spec.reward.import_path, near=near) if spec.reward.import_path else None
    return AgentEnv(spec, tokenizer, sandbox, entry, reward_fn, limits, shared_sandbox)
