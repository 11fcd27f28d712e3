"""One episode of a SimpleTIR environment, token ids in and out.

    env = envs.make(spec, tokenizer, sandbox=shared_sandbox)   # cheap: data and glue cached per spec
    ids = env.reset(task)
    while True:
        sampled = engine.generate(ids, stop=env.stop_strings, max_new_tokens=env.max_new_tokens)
        res = await env.step(sampled.ids, truncated=sampled.finish_reason == "length")
        if res.done: break                       # res.reward, res.info.finish, res.info.masked
        ids += sampled.ids + res.observation_ids

The model's tokens are decoded only to parse them (code, \\boxed{}); the observation and
its template glue are tokenized on their own and returned as `observation_ids`. Per call work is kept
small (benchmarks/orchestration.py): text goes through `envs.codec`, and a prompt's ids are built once
per task and tokenizer, not once per episode (a group's n episodes share them).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from envs import rewards
from envs.codec import Codec, codec
from envs.datasets import DatasetReport, env_split
from envs.loop_resources import loop_resources
from envs.spec import EnvSpec, load_callable
from envs.tir import ObservationFormatter, parse_turn, tool_output
from envs.turns import TurnBudget
from envs.types import EnvError, Finish, StepInfo, StepResult, Task
from envs.verify_pool import default_pool


@dataclass
class _Shared:
    """Everything an episode needs that does not change between episodes of one spec and tokenizer."""

    spec: EnvSpec
    tokenizer: Any
    codec: Codec
    formatter: ObservationFormatter
    limits: Any  # sandboxes.Limits
    reward_fn: Any  # the callable reward, when reward.type == "callable"
    prompts: dict[str, list[int]] = field(default_factory=dict)  # task id -> prompt ids (bounded)


_SHARED: dict[tuple[int, int], _Shared] = {}  # (id(spec), id(tokenizer)); the entry holds both alive
_PROMPTS_KEPT = 4096


def make_limits(spec: EnvSpec) -> Any:
    import sandboxes

    try:
        return sandboxes.Limits(**spec.sandbox.limits)
    except (TypeError, ValueError) as e:
        raise EnvError(
            f"{spec.source_path or spec.name}: sandbox.limits {spec.sandbox.limits}: {e}"
        ) from None


def make_sandbox(spec: EnvSpec) -> Any:
    """A new sandbox as the spec asks for it; the caller closes it."""
    import sandboxes

    return sandboxes.create(spec.sandbox.backend, limits=make_limits(spec), **spec.sandbox.options)


def shared_sandbox(spec: EnvSpec) -> Any:
    """The sandbox shared by this event loop's episodes of every spec with the same sandbox section."""
    per_loop = loop_resources()
    key = "sandbox:" + spec.sandbox.model_dump_json()
    if key not in per_loop:
        per_loop[key] = make_sandbox(spec)
    return per_loop[key]


def make(spec: EnvSpec, tokenizer: Any, sandbox: Any = None) -> Env:
    """A fresh episode. Without `sandbox`, the first code run uses the loop's shared sandbox for this spec."""
    if spec.type == "verifiers":  # a verifiers environment's harness runs the episode (envs/verifiers_env.py)
        from envs.verifiers_env import VerifiersEnv

        return VerifiersEnv(
            spec, tokenizer, sandbox, None, None, make_limits(spec), lambda: shared_sandbox(spec)
        )
    if spec.type == "harbor":  # a Harbor task's container, the built-in shell agent (envs/harbor/env.py)
        from envs.harbor.env import HarborEnv

        return HarborEnv(spec, tokenizer)  # type: ignore[return-value]
    if spec.type in ("agent", "external"):  # an agent runs the episode through the gateway (envs/agent.py)
        from envs.agent import make_agent_env

        return make_agent_env(spec, tokenizer, sandbox, make_limits(spec), lambda: shared_sandbox(spec))
    key = (id(spec), id(tokenizer))
    shared = _SHARED.get(key)
    if shared is None or shared.spec is not spec or shared.tokenizer is not tokenizer:
        obs = spec.tool.observation
        shared = _Shared(
            spec=spec,
            tokenizer=tokenizer,
            codec=codec(tokenizer),
            formatter=ObservationFormatter(tokenizer, obs.template, obs.max_tokens),
            limits=make_limits(spec),
            reward_fn=load_callable(spec.reward.import_path, near=spec.source_path)
            if spec.reward.import_path
            else None,
        )
        _SHARED[key] = shared
    return Env(shared, sandbox)


class Env(TurnBudget):
    def __init__(self, shared: _Shared, sandbox: Any = None):
        self._s = shared
        self.spec = shared.spec
        self._sandbox = sandbox
        self._session: Any = None
        self._task: Task | None = None
        self._texts: list[str] = []
        self._turns = 0
        self._used = 0  # response tokens so far: sampled + observation
        self._done = False

    # -- data -----------------------------------------------------------------------------
    def tasks(self, split: str) -> tuple[Task, ...]:
        return env_split(self.spec, split)[0]

    def data_report(self, split: str) -> DatasetReport:
        """What the loader fixed or dropped in this split."""
        return env_split(self.spec, split)[1]

    # -- episode --------------------------------------------------------------------------
    def reset(self, task: Task) -> list[int]:
        if self._session is not None:
            raise EnvError(
                "reset() during an episode with an open session; await env.close() or make a new env"
            )
        self._task, self._texts, self._turns, self._used, self._done = task, [], 0, 0, False
        prompts = self._s.prompts
        ids = prompts.get(task.id)
        if ids is None:
            if len(prompts) >= _PROMPTS_KEPT:
                del prompts[next(iter(prompts))]  # the oldest
            ids = prompts[task.id] = self._prompt_ids(task)
        return list(ids)

    def _prompt_ids(self, task: Task) -> list[int]:
        p = self.spec.prompt
        content = (
            p.template.replace("{problem}", task.problem)
            .replace("{numbers}", str(list(task.numbers)))
            .replace("{target}", task.answer)
        )
        if not p.chat_template:
            return self._s.codec.encode(content)
        messages = ([{"role": "system", "content": p.system}] if p.system else []) + [
            {"role": "user", "content": content}
        ]
        text = self._s.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._s.codec.encode(text)

    def encode_observation(self, output: str) -> list[int]:
        """Env tokens for a tool output as this env shows it (template glue, middle truncation)."""
        return self._s.formatter.encode(output)

    async def step(self, sampled_ids: list[int], *, truncated: bool = False) -> StepResult:
        """Consume one turn of sampled ids. `truncated`: the engine stopped at max_new_tokens."""
        if self._task is None:
            raise EnvError("step() before reset()")
        if self._done:
            raise EnvError("step() after the episode ended; make a new env per episode")
        self._turns += 1
        self._used += len(sampled_ids)
        text = self._s.codec.decode(sampled_ids, skip_special_tokens=True)
        self._texts.append(text)
        turn = parse_turn(text)
        t = self.spec.turns
        if turn.code is not None:
            if self._turns >= t.max_turns:
                return await self._finish("max_turns")
            if self._used >= t.max_response_tokens:
                return await self._finish("length")
            return await self._run_code(turn.code)
        if turn.answer is not None:
            return await self._finish("answer")
        if truncated or self._used >= t.max_response_tokens:
            return await self._finish("length")
        return await self._finish("void")

    async def _run_code(self, code: str) -> StepResult:
        limits = self._s.limits
        start = time.perf_counter()
        if self._sandbox is None:
            self._sandbox = shared_sandbox(self.spec)
        if self.spec.tool.session:
            if self._session is None:
                self._session = self._sandbox.session(limits=limits)
            res = await self._session.run(code, limits=limits)
        else:
            res = await self._sandbox.run(code, limits=limits)
        seconds = time.perf_counter() - start
        obs = self.spec.tool.observation
        shown = tool_output(
            res.stdout,
            res.stderr,
            res.exit_code,
            res.timed_out,
            res.oom_killed,
            limits.timeout_s,
            obs.on_error,
            obs.empty,
        )
        ids = self.encode_observation(shown)
        ran = dict(code_ran=True, exit_code=res.exit_code, timed_out=res.timed_out, tool_seconds=seconds)
        if self._used + len(ids) >= self.spec.turns.max_response_tokens:
            return await self._finish("length", **ran)  # no room for another turn after this output
        self._used += len(ids)
        return StepResult(ids, None, False, StepInfo(**ran))

    async def _finish(self, finish: Finish, **ran: Any) -> StepResult:
        self._done = True
        await self._close_session()
        if finish == "void":
            masked = self.spec.tool.void_turn == "mask"
            return StepResult([], 0.0, True, StepInfo(finish="void", masked=masked, **ran))
        reward, answer, timed_out = await self._score()
        return StepResult(
            [], reward, True, StepInfo(finish=finish, answer=answer, reward_timed_out=timed_out, **ran)
        )

    async def _score(self) -> tuple[float, str | None, bool]:
        text, task, r = self.response_text, self._task, self.spec.reward
        assert task is not None
        if r.type == "countdown":
            expr = rewards.countdown_expression(text)
            return rewards.countdown_score(expr, task.numbers, task.answer), expr, False
        if r.type == "callable":
            value = float(self._s.reward_fn(text, task, **r.kwargs))
            if not math.isfinite(value):
                raise EnvError(
                    f"reward {r.import_path} returned {value} for task {task.id}; rewards must be finite"
                )
            return value, rewards.last_boxed(text), False
        answer = rewards.last_boxed(text)
        if answer is None:
            return 0.0, None, False
        if r.type == "integer":
            return float(rewards.integer_match(answer, task.answer)), answer, False
        verdict = await default_pool().verify(answer, task.answer, timeout_s=r.timeout_s)
        return float(verdict.correct), answer, verdict.timed_out

    async def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def close(self) -> None:
        """Close the episode's interpreter session, if one is open (an abandoned episode in session mode)."""
        await self._close_session()
