"""`type: verifiers`: a `verifiers` (0.4) environment trained through our loop (`pip install 'agent-rl[verifiers]'`).

verifiers splits an environment into a taskset (data and `@vf.reward` functions) and a harness (the agent
program that plays a task, e.g. its built-in `null` chat loop with the taskset's MCP tools, run under uv in a
runtime). Each of our episodes runs one verifiers episode, `Env.run_episode(task, ModelContext)`, whose model
endpoint is this episode's gateway session, so every model call the harness makes is recorded as token ids
with log-probs and versions (agent_rl/gateway), and the episode's reward is the mean of its traces' rewards.
The env is loaded once per spec; its serving resources (interception server, shared tool servers) live on the
event loop until `envs.close_shared_sandboxes()`. A verifiers episode that fails is raised, so the gateway
session tells engine failures (re-sampled), budget overruns (reward 0) and agent bugs apart, as for `type: agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from dataclasses import dataclass
from typing import Any

from envs.agent import AgentEnv, AgentOutcome
from envs.datasets import DatasetReport
from envs.loop_resources import loop_resources
from envs.spec import EnvSpec, env_config
from envs.types import EnvError, Task

KEY_VAR = "AGENT_RL_GATEWAY_KEY"  # + a per-episode suffix: the env var verifiers reads the session token from


@dataclass
class _Loaded:
    env: Any  # verifiers.v1.Env
    tasks: dict[str, Any]  # our task id -> the verifiers Task
    splits: dict[str, tuple[Task, ...]]
    serving: contextlib.AsyncExitStack | None = None
    lock: asyncio.Lock | None = None

    async def start(self) -> None:
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            if self.serving is None:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(self.env.serving())
                self.serving = stack

    async def close(self) -> None:
        if self.serving is not None:
            stack, self.serving = self.serving, None
            await stack.aclose()


_LOADED: dict[EnvSpec, _Loaded] = {}


def _load(spec: EnvSpec) -> _Loaded:
    if spec not in _LOADED:
        from verifiers.v1.utils.loaders import load_environment

        cfg = spec.verifiers
        env = load_environment(env_config(cfg.env))
        every = list(env.taskset)
        tasks, splits = {}, {}
        for name, part in cfg.splits.items():
            chosen = every[part.skip :][: part.limit] if part.limit else every[part.skip :]
            ours = []
            for t in chosen:
                tid = t.data.id or f"{t.data.idx}"
                tasks[tid] = t
                prompt = t.data.prompt if isinstance(t.data.prompt, str) else str(t.data.prompt or "")
                ours.append(Task(id=tid, problem=prompt, answer="", source=cfg.env["taskset"]["id"]))
            splits[name] = tuple(ours)
        _LOADED[spec] = _Loaded(env, tasks, splits)
    return _LOADED[spec]


class VerifiersEnv(AgentEnv):
    """One verifiers episode per agent episode, its model calls through the episode's gateway client."""

    def _split(self, split: str) -> tuple[tuple[Task, ...], DatasetReport]:
        splits = _load(self.spec).splits
        if split not in splits:
            raise EnvError(f"env {self.spec.name!r} has no split {split!r}; it has {sorted(splits)}")
        tasks = splits[split]
        return tasks, DatasetReport(
            source=f"verifiers:{self.spec.verifiers.env['taskset']['id']}", tasks=len(tasks)
        )

    async def run(self, client: Any) -> AgentOutcome:
        import verifiers.v1 as vf

        loaded = _load(self.spec)
        loop_resources()[f"verifiers:{id(loaded)}"] = loaded
        await loaded.start()
        # verifiers reads the key from an env var: this episode's own, holding its session's token (which opens
        # this session's routes only, never the run's key), removed when the episode ends
        var = f"{KEY_VAR}_{uuid.uuid4().hex[:12].upper()}"
        os.environ[var] = client.api_key
        try:
            ctx = vf.ModelContext(
                model=self.spec.verifiers.model,
                client=vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=var),
            )
            episode = await loaded.env.run_episode(loaded.tasks[self.task.id], ctx)
        finally:
            os.environ.pop(var, None)
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        if not episode.ok or errors:
            why = errors[0].message.splitlines()[0] if errors else "not ok"
            raise EnvError(f"verifiers episode of task {self.task.id} failed: {why}")
        rewards = [t.reward for t in episode.traces]
        return AgentOutcome(sum(rewards) / len(rewards), episode.traces[-1].last_reply)
