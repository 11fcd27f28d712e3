"""`agent-rl eval`: pass@1 / avg@n of a policy on each eval env's split, with tool-use and speed numbers.

The same rollout workers as training run the episodes (a buffer with k=0 that admits
exactly the eval tasks), so eval measures the policy the way training samples it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, EnvRef, EvalConfig, Recipe, RolloutConfig
from agent_rl.engines.api import EngineClient
from agent_rl.rollout.workers import PromptSource, Rollouts
from envs.spec import EnvSpec

if TYPE_CHECKING:
    from agent_rl.runtime import Runtime


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


async def evaluate_policy(
    spec: EnvSpec,
    cfg: EvalConfig,
    rollout: RolloutConfig,
    engine: EngineClient,
    tokenizer: Any,
    sandbox: Any,
    *,
    max_seq_len: int,
    seed: int,
    progress: bool = False,
) -> EvalReport:
    """Run `spec`'s eval split against `engine` (whatever weights it holds now). Run on the engine's loop.

    progress: a bar of finished episodes on stderr (the CLI's `agent-rl eval`)."""
    import asyncio

    import envs

    tasks = list(envs.make(spec, tokenizer, sandbox).tasks(cfg.split))[: cfg.limit]
    n = cfg.samples_per_task
    buffer = RolloutBuffer(
        BufferConfig(max_staleness=0, mask_void=False), batch_prompts=len(tasks), group_size=n
    )
    rollouts = Rollouts(
        rollout,
        buffer,
        PromptSource(tasks, seed=seed),
        lambda: envs.make(spec, tokenizer, sandbox),
        engine,
        max_seq_len=max_seq_len,
        seed=seed + 1,
    )
    t0 = time.monotonic()
    rollouts.start()
    bar = asyncio.ensure_future(_progress(rollouts, spec.name, len(tasks) * n)) if progress else None
    try:
        groups = await buffer.take(len(tasks))
    finally:
        if bar is not None:
            bar.cancel()
        await rollouts.stop()
    seconds = time.monotonic() - t0
    trajs = [t for g in groups for t in g.trajectories]
    correct = [[(t.reward or 0.0) > 0 for t in g.trajectories] for g in groups]
    return EvalReport(
        env=spec.name,
        split=cfg.split,
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


def periodic(rt: Runtime) -> dict[str, float]:
    """Periodic eval during training: the policy the engines hold now, on every env of `envs.eval`."""
    reports = [_report(rt, spec) for spec in eval_specs(rt.recipe.envs)]
    # the engines' version: under rollout.fixed_lag it is k behind the learner's (learner/version)
    return eval_metrics(reports) | {"eval/policy_version": float(rt.publisher.engine_version or 0)}


def _report(rt: Runtime, spec: EnvSpec, progress: bool = False) -> EvalReport:
    r = rt.recipe
    return rt.loop.call(
        evaluate_policy(
            spec, r.eval, r.rollout, rt.engines.client, rt.tokenizer, rt.sandbox,
            max_seq_len=r.engines.max_seq_len, seed=r.train.seed, progress=progress,
        )
    )  # fmt: skip


async def _progress(rollouts: Rollouts, name: str, total: int) -> None:
    """Episodes finished so far, redrawn twice a second until cancelled."""
    import asyncio

    from tqdm import tqdm

    with tqdm(total=total, desc=f"eval {name}", unit="episode", leave=False) as bar:
        while True:
            bar.update(min(rollouts.counters.episodes, total) - bar.n)
            await asyncio.sleep(0.5)


def eval_specs(ref: EnvRef) -> list[EnvSpec]:
    """Every env of `envs.eval` (default: the train env), loaded and checked."""
    import envs

    return [envs.load(path) for path in (ref.eval or (ref.train,))]


def eval_metrics(reports: list[EvalReport]) -> dict[str, float]:
    """One env: `eval/...`; several: `eval/<env name>/...` each."""
    if len(reports) == 1:
        return reports[0].metrics()
    return {k: v for r in reports for k, v in r.metrics(f"eval/{r.env}").items()}


def evaluate(recipe: Recipe, checkpoint: Path | None = None) -> EvalReport:
    """The first eval env's report (see `evaluate_all` for every env)."""
    return evaluate_all(recipe, checkpoint, first_only=True)[0]


def evaluate_all(
    recipe: Recipe, checkpoint: Path | None = None, *, first_only: bool = False, progress: bool = False
) -> list[EvalReport]:
    """Evaluate a training checkpoint (its hf/ export; a run dir means its latest checkpoint) or the recipe's
    model on every env of `envs.eval` (default: the train env), one report each."""
    from agent_rl import auth
    from agent_rl import checkpoint as ckpt
    from agent_rl.runtime import Runtime

    model = recipe.model
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        if (checkpoint / "checkpoints").is_dir():
            checkpoint = ckpt.latest(checkpoint)
        model_dir = checkpoint / "hf" if (checkpoint / "hf").is_dir() else checkpoint
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"--checkpoint {checkpoint}: no Hugging Face model (config.json) in {model_dir}"
            )
        tokenizer = str(model_dir) if (model_dir / "tokenizer_config.json").is_file() else None
        # the export carries the tokenizer the run used
        model = model.model_copy(
            update={"path": str(model_dir), "tokenizer": tokenizer or model.tokenizer or model.path}
        )
    specs = eval_specs(recipe.envs)[:1] if first_only else eval_specs(recipe.envs)
    with auth.run_access(None), Runtime(recipe, model=model) as rt:  # the run's key for what it starts
        return [_report(rt, spec, progress) for spec in specs]


def main_eval(argv: list[str] | None = None) -> int:
    """`agent-rl eval RECIPE [--checkpoint DIR] [--set key=value ...]`: prints the report as JSON."""
    import argparse
    import json

    from agent_rl.config import load_recipe

    p = argparse.ArgumentParser(
        prog="agent-rl eval", description="Evaluate a policy on every eval env of the recipe (envs.eval)."
    )
    p.add_argument("recipe", type=Path)
    p.add_argument(
        "--checkpoint", type=Path, help="a checkpoint dir or a run dir (its latest); default: model.path"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    recipe = load_recipe(args.recipe, args.set, check_model=args.checkpoint is None)
    reports = evaluate_all(recipe, args.checkpoint, progress=True)
    out = reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports]
    print(json.dumps(out, indent=2))
    return 0
