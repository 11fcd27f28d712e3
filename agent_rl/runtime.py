"""What training and evaluation run on, built once and owned in one place.

`Runtime(recipe)` applies the placement plan, loads the tokenizer, starts the rollout side's event loop
(LoopThread), the sandbox and the engines; with `with_learner=True` also the learner. `start()` adds the
training parts: buffer, prompt source, weight publisher (one push before step 1, so a broken weight
path fails now) and the rollout workers. Everything on the rollout loop is reached through plain
synchronous methods (take, publish, set_bound, stats, snapshot), so the loop in trainer.py
reads like the design. `close()` (or leaving the `with` block) stops what was started, in reverse order,
however we leave.
"""

from __future__ import annotations

import concurrent.futures
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import envs
from agent_rl import checkpoint, hosts, placement
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import ModelConfig, Recipe
from agent_rl.engines.elastic import Engines
from agent_rl.learners.api import Learner
from agent_rl.loop_thread import LoopThread
from agent_rl.rollout import build_rollouts
from agent_rl.rollout.workers import PromptSource, Rollouts
from agent_rl.teacher import TeacherBuffer, TeacherScorer, start_teacher
from agent_rl.types import Group
from agent_rl.weight_sync import make_publisher
from agent_rl.weight_sync.publish import Publisher


class Runtime:
    def __init__(
        self,
        recipe: Recipe,
        *,
        model: ModelConfig | None = None,
        address: str | None = None,
        with_learner: bool = False,
    ):
        """`model`: serve these weights instead of recipe.model (eval of a checkpoint); `address`: a Ray
        cluster to join (placement decides what runs where)."""
        from transformers import AutoTokenizer

        self.recipe, self.model = recipe, model or recipe.model
        self._stack = ExitStack()
        self.plan = placement.plan(recipe.engines, recipe.learner, recipe.placement, address)
        placement.apply(self.plan)  # Ray only if the plan needs it
        self.spec = envs.load(recipe.envs.train)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model.tokenizer or self.model.path)
        self.buffer: RolloutBuffer | None = None
        self.rollouts: Rollouts | Any = None  # or rollout.sharded.ShardedRollouts
        self.publisher: Publisher | None = None
        self.learner: Learner | None = None
        try:
            self.loop = LoopThread()  # buffer, engines, sandbox and episodes all live on this event loop
            self._stack.callback(self.loop.close)
            self.spec, service = self.loop.call(hosts.place_sandbox(self.plan, self.spec))  # on its node
            self._stack.callback(lambda: service and self.loop.call(hosts.stop_server(service)))
            self.sandbox = envs.make_sandbox(self.spec)
            self._stack.callback(lambda: self.loop.call(self.sandbox.close()))
            self._stack.callback(lambda: self.loop.call(envs.close_shared_sandboxes()))  # + MCP tool servers
            start = partial(
                hosts.start_engines, self.plan, recipe.engines, self.model, seed=recipe.train.seed,
                lora=recipe.learner.lora,
            )  # fmt: skip
            # Embedded engine servers on cores of their own (topology processes) boot while the learner's process
            # loads: nothing shared to race for, so start-up takes the slower of the two, not their sum. GPU
            # engines (SGLang, vLLM) start after the learner, whose memory they then see as taken.
            booting = (
                self.loop.submit(start())
                if self.plan.cores is not None and recipe.engines.type == "embedded"
                else None
            )
            try:
                if with_learner:
                    from agent_rl.learners import build

                    cores = self.plan.cores.learner_ranks if self.plan.cores else None
                    self.learner = build(recipe.learner_spec, rank_cores=cores)
                    self._stack.callback(self.learner.close)
            except BaseException:
                if booting is not None:  # stopped with the rest below once they are up
                    self._adopt(booting)
                raise
            self._adopt(booting or self.loop.submit(start()))
        except BaseException:
            self._stack.close()
            raise

    def _adopt(self, started: concurrent.futures.Future[Engines]) -> None:
        self.engines = started.result()
        self._stack.callback(lambda: self.loop.call(self._shutdown()))

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    # -- training --------------------------------------------------------------------------
    def start(self, run_dir: Path, state: checkpoint.LoopState | None = None) -> int:
        """Build the training parts (restoring `state`, a checkpoint's loop state), push the learner's weights
        and start the rollout workers. Returns the first step to run."""
        recipe, learner = self.recipe, self.learner
        assert learner is not None, "Runtime(with_learner=True) builds the learner that start() publishes"
        lagged = recipe.rollout.fixed_lag is not None  # admission lag 0: one batch sampled at a time
        scorer = self._start_teacher()  # algorithm.teacher: the buffer sends finished trajectories to it
        self.buffer = (RolloutBuffer if scorer is None else partial(TeacherBuffer, scorer))(
            recipe.buffer_in_force,
            batch_prompts=recipe.train.batch_prompts,
            group_size=self.spec.group_size,
            admit_lag=0 if lagged else None,
        )
        self.prompts = PromptSource(self._env().tasks("train"), seed=recipe.train.seed)
        self.publisher = make_publisher(
            recipe.engines, recipe.rollout.fixed_lag, self.engines.client, self.loop, scratch=run_dir / "w"
        )
        self._stack.callback(self.publisher.close)  # nccl: engines leave the weight group before they close
        if state is not None:
            self.buffer.load_state(state.buffer)
            self.prompts.load_state(state.prompts)
            self.publisher.load_state(state.publisher)
        self.publish(learner)  # before step 1: a broken weight path fails now, not after an optimizer step
        self.rollouts = build_rollouts(  # in this process, or sharded over rollout.workers processes
            recipe.rollout, self.buffer, self.prompts, self._env, self.engines.client, spec=self.spec,
            tokenizer=self.tokenizer, max_seq_len=recipe.engines.max_seq_len, seed=recipe.train.seed,
        )  # fmt: skip
        self.loop.call(_run(self.rollouts.start))
        self.loop.call(_run(self.engines.watch, run_dir))  # `agent-rl engines add|remove RUN_DIR`
        return 0 if state is None else state.step

    def take(self) -> list[Group]:
        """The next batch of whole groups within the staleness bound (waits for it)."""
        return self.loop.call(self.buffer.take(self.recipe.train.batch_prompts))

    def publish(self, learner: Learner) -> dict[str, float]:
        """Push the learner's weights to the engines (pause, abort in flight, load, resume) and move the
        buffer to the new version. Returns the push time and the staleness of the batch just trained."""
        seconds = self.publisher.push(learner)
        stats = self.loop.call(_run(self.buffer.stats))  # measured against the version it trained
        self.loop.call(_run(self.buffer.set_version, learner.version))
        return stats | {"perf/weight_sync_seconds": seconds}

    def set_bound(self, k: int) -> None:
        self.loop.call(_run(self.buffer.set_bound, k))

    def stats(self) -> dict[str, float]:
        """The rollout workers' counters since the previous call."""
        return self.loop.call(_run(self.rollouts.stats))

    def snapshot(self, step: int) -> checkpoint.LoopState:
        """The loop's state for a checkpoint taken before `step` (one consistent snapshot on the loop)."""
        prompts, buffer = self.loop.call(_run(lambda: (self.prompts.state(), self.buffer.state())))
        return checkpoint.LoopState(step, prompts, buffer, publisher=self.publisher.state())

    # -- internals -------------------------------------------------------------------------
    def _start_teacher(self) -> TeacherScorer | None:
        """On-policy distillation: the teacher's engines (in this process, or on the engine cores under
        placement.topology: processes) and the scorer the buffer feeds; None without algorithm.teacher."""
        cfg = self.recipe.algorithm.teacher
        if cfg is None:
            return None
        cores = sorted({c for cs in self.plan.cores.engines for c in cs}) if self.plan.cores else None
        engines = self.loop.call(
            start_teacher(cfg, self.tokenizer, max_seq_len=self.recipe.engines.max_seq_len,
                          seed=self.recipe.train.seed, cores=cores)
        )  # fmt: skip
        self._stack.callback(lambda: self.loop.call(engines.close()))
        scorer = self.loop.call(
            _run(lambda: TeacherScorer(engines.clients, max_concurrent=cfg.max_concurrent))
        )
        self._stack.callback(lambda: self.loop.call(scorer.close()))
        return scorer

    def _env(self) -> envs.Env:
        return envs.make(self.spec, self.tokenizer, self.sandbox)  # one Env per episode

    async def _shutdown(self) -> None:
        if self.rollouts is not None:
            self.rollouts.stopping()  # an episode that meets the closing engine is not an infrastructure failure
        await (
            self.engines.close()
        )  # first: cancelling episodes mid-call into a live engine would race its thread
        if self.rollouts is not None:
            await self.rollouts.stop()


async def _run(fn: Any, *args: Any) -> Any:
    """Call `fn` on the rollout loop's thread (every touch of the buffer and workers happens there)."""
    return fn(*args)
