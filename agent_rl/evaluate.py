"""`agent-rl eval`: pass@1 / avg@n of a policy on an env's eval split, with tool-use and speed numbers.

The same rollout workers as training run the episodes (a buffer with k=0 that admits
exactly the eval tasks), so eval measures the policy the way training samples it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, Recipe
from agent_rl.engines.api import EngineClient
from agent_rl.rollout import LoopThread, PromptSource, Rollouts


@dataclass(frozen=True)
class EvalReport:
    env: str
    split: str
    tasks: int
    samples_per_task: int
    accuracy: float  # avg@n: mean reward over every sample (= pass@1 estimated from n samples)
    pass_at_n: float  # share of tasks with at least one correct sample
    tool_use_rate: float  # share of episodes that ran code at least once
    turns_per_episode: float
    tokens_per_s: float  # sampled tokens per wall second
    errors: int  # episodes lost to infrastructure errors (re-run, not scored as 0)
    seconds: float

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        return {
            f"{prefix}/accuracy": self.accuracy,
            f"{prefix}/pass_at_n": self.pass_at_n,
            f"{prefix}/tool_use_rate": self.tool_use_rate,
            f"{prefix}/turns_per_episode": self.turns_per_episode,
            f"{prefix}/tokens_per_s": self.tokens_per_s,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def evaluate_policy(recipe: Recipe, engine: EngineClient, tokenizer: Any, sandbox: Any) -> EvalReport:
    """Run the first eval env's split against `engine` (whatever weights it holds now). Run on the engine's loop."""
    import envs

    path = recipe.envs.eval[0] if recipe.envs.eval else recipe.envs.train
    spec = envs.load(path)
    tasks = list(envs.make(spec, tokenizer, sandbox).tasks(recipe.eval.split))[: recipe.eval.limit]
    n = recipe.eval.samples_per_task
    buffer = RolloutBuffer(
        BufferConfig(max_staleness=0, mask_void=False), batch_prompts=len(tasks), group_size=n
    )
    rollouts = Rollouts(
        recipe.rollout,
        buffer,
        PromptSource(tasks, seed=recipe.train.seed),
        lambda: envs.make(spec, tokenizer, sandbox),
        engine,
        max_seq_len=recipe.engines.max_seq_len,
        seed=recipe.train.seed + 1,
    )
    t0 = time.monotonic()
    rollouts.start()
    try:
        groups = await buffer.take(len(tasks))
    finally:
        await rollouts.stop()
    seconds = time.monotonic() - t0
    trajs = [t for g in groups for t in g.trajectories]
    correct = [[(t.reward or 0.0) > 0 for t in g.trajectories] for g in groups]
    return EvalReport(
        env=spec.name,
        split=recipe.eval.split,
        tasks=len(tasks),
        samples_per_task=n,
        accuracy=sum(t.reward or 0.0 for t in trajs) / len(trajs),
        pass_at_n=sum(any(c) for c in correct) / len(correct),
        tool_use_rate=sum(any(turn.code_ran for turn in t.turns) for t in trajs) / len(trajs),
        turns_per_episode=sum(len(t.turns) for t in trajs) / len(trajs),
        tokens_per_s=rollouts.counters.sampled_tokens / seconds,
        errors=rollouts.counters.errors,
        seconds=seconds,
    )


def evaluate(recipe: Recipe, checkpoint: Path | None = None) -> EvalReport:
    """Evaluate a training checkpoint (its hf/ export; a run dir means its latest checkpoint) or the recipe's model."""
    from transformers import AutoTokenizer

    import envs
    from agent_rl import checkpoint as ckpt
    from agent_rl import placement

    model_dir = Path(recipe.model.path)
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        if (checkpoint / "checkpoints").is_dir():
            checkpoint = ckpt.latest(checkpoint)
        model_dir = checkpoint / "hf" if (checkpoint / "hf").is_dir() else checkpoint
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"--checkpoint {checkpoint}: no Hugging Face model (config.json) in {model_dir}"
            )
    model = recipe.model.model_copy(update={"path": str(model_dir)})
    tokenizer = AutoTokenizer.from_pretrained(recipe.model.tokenizer or recipe.model.path)
    spec = envs.load(recipe.envs.eval[0] if recipe.envs.eval else recipe.envs.train)
    loop = LoopThread()
    sandbox = envs.make_sandbox(spec)
    plan = placement.plan(recipe)
    placement.apply(plan)
    engines = loop.call(placement.start_engines(plan, recipe.engines, model, seed=recipe.train.seed))
    try:
        return loop.call(evaluate_policy(recipe, engines.client, tokenizer, sandbox))
    finally:
        loop.call(_close(engines, sandbox))
        loop.close()


async def _close(engines: Any, sandbox: Any) -> None:
    await engines.close()
    await sandbox.close()


def main_eval(argv: list[str] | None = None) -> int:
    """`agent-rl eval RECIPE [--checkpoint DIR] [--set key=value ...]`: prints the report as JSON."""
    import argparse
    import json

    from agent_rl.config import load_recipe

    p = argparse.ArgumentParser(
        prog="agent-rl eval", description="Evaluate a policy on the recipe's eval env."
    )
    p.add_argument("recipe", type=Path)
    p.add_argument(
        "--checkpoint", type=Path, help="a checkpoint dir or a run dir (its latest); default: model.path"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    report = evaluate(load_recipe(args.recipe, args.set), args.checkpoint)
    print(json.dumps(report.to_dict(), indent=2))
    return 0
