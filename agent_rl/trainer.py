"""THE training loop, top to bottom (`agent-rl train RECIPE`).

Rollout workers run all the time on a background event loop and fill the buffer; this
loop is the learner's side only. Asynchrony is the buffer's business (its staleness bound
k and admission control), so k=0 (synchronous, on-policy) and k>0 run the same lines.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from pathlib import Path

import envs
from agent_rl import auth, checkpoint, evaluate, placement, rundir
from agent_rl.config import Recipe
from agent_rl.errors import Terminated
from agent_rl.metrics import RunWriter, log_batch, mean_reward, progress_fields
from agent_rl.monitor import LoopMonitor
from agent_rl.preemption import StopOnSigterm
from agent_rl.runtime import Runtime
from agent_rl.viewer.log import TrajectoryLog


def train(recipe: Recipe, *, resume: str | Path | None = None, address: str | None = None) -> Path:
    """Train `recipe`; with `resume`, continue that run directory ("auto": the recipe's own, if it has a
    checkpoint) from its latest checkpoint. Returns the run dir."""
    from tqdm import tqdm

    run_dir, resuming = rundir.choose(recipe, resume)  # a fresh run never writes into an old run's dir
    if resuming:
        rundir.warn_on_differences(run_dir, recipe)
    rundir.announce(run_dir, recipe, resuming)
    stopped_at = None  # the step after which a SIGTERM stopped the run
    access = auth.run_access(run_dir, external_agents=envs.load(recipe.envs.train).external is not None)
    with access, Runtime(recipe, address=address, with_learner=True) as rt, ExitStack() as cleanup:
        learner = rt.learner
        state = checkpoint.load(checkpoint.latest(run_dir), learner) if resuming else None
        start = rt.start(run_dir, state)  # buffer, prompts, first weight push, rollout workers
        checkpoint.truncate_logs(run_dir, start)  # records a killed run wrote after its last checkpoint
        writer = cleanup.enter_context(
            RunWriter(run_dir, recipe, backends=recipe.logging.sinks, project=recipe.logging.project)
        )
        trajectories = TrajectoryLog(
            run_dir, recipe.logging.trajectories, tokenizer=recipe.model.tokenizer or recipe.model.path,
            is_truncation=recipe.algorithm.is_truncation, seed=recipe.train.seed, start=start,
        )  # fmt: skip
        monitor = LoopMonitor(recipe.monitor, recipe.buffer_in_force.max_staleness)  # collapse early warning

        def save(step: int) -> None:  # the export carries the run's tokenizer
            checkpoint.save(run_dir, learner, rt.snapshot(step), model_dir=Path(recipe.model.path),
                            keep=recipe.checkpoint.keep, tokenizer=rt.tokenizer)  # fmt: skip

        if start == 0 and recipe.monitor.on_warning == "rollback":  # the start, never pruned: a rollback can
            save(0)  # always reach a checkpoint from before the trouble
        bar = cleanup.enter_context(tqdm(initial=start, total=recipe.train.steps, desc=recipe.name))
        sigterm = cleanup.enter_context(StopOnSigterm())  # SIGTERM: stop after this step, with a checkpoint
        for step in range(start, recipe.train.steps):
            t0 = time.monotonic()
            batch = rt.take()
            t_wait = time.monotonic() - t0
            metrics = dict(learner.step(batch))
            t_learn = time.monotonic() - t0 - t_wait
            metrics |= rt.publish(learner) | rt.stats()  # engines pause, abort in-flight turns, load, resume
            metrics["perf/trajectory_log_seconds"] = trajectories.append(step, batch, learner, metrics)
            step_s = time.monotonic() - t0
            metrics |= {
                "rollout/reward_mean": mean_reward(batch),
                "perf/step_seconds": step_s,
                "perf/wait_seconds": t_wait,
                "perf/learner_busy_fraction": t_learn / step_s,
                "learner/version": learner.version,
            }
            response = monitor.observe(step, metrics)  # monitor.on_warning: log/stop/rollback/adapt
            metrics |= response.metrics
            if response.staleness_bound is not None:
                rt.set_bound(response.staleness_bound)
            if recipe.eval.every and (step + 1) % recipe.eval.every == 0:
                metrics |= evaluate.periodic(rt)
            writer.log(step, metrics)
            log_batch(run_dir, step, batch)
            bar.set_postfix(progress_fields(metrics), refresh=False)
            bar.update()  # the step is done: a stop below leaves the bar at the step the stop line names
            every = recipe.checkpoint.every or recipe.train.steps
            halt = response.stop or sigterm.requested
            if halt or (step + 1) % every == 0 or step + 1 == recipe.train.steps:
                save(step + 1)
            if response.stop:
                print(f"{recipe.name}: {response.message}", file=sys.stderr, flush=True)
            if halt:
                stopped_at = step + 1 if sigterm.requested else None
                break
            if response.rollback:  # restored weights and optimizer, lower lr, published as a new version
                monitor.rollback(run_dir, learner, rt.publisher, response.warning)
                rt.publish(learner)
    if stopped_at is not None and stopped_at < recipe.train.steps:
        raise Terminated(
            f"stopped by SIGTERM after step {stopped_at} of {recipe.train.steps}, its checkpoint saved: "
            f"continue with agent-rl train --resume {run_dir}"
        )
    return run_dir


def main_train(argv: list[str] | None = None) -> int:
    """`agent-rl train RECIPE [--resume RUN_DIR] [--set key=value ...] [--address RAY] [--dry-run]`."""
    import argparse

    from agent_rl.config import load_recipe

    p = argparse.ArgumentParser(prog="agent-rl train", description="Train a recipe (async RL with VCPO).")
    p.add_argument(
        "recipe", type=Path, nargs="?", help="the recipe (optional with --resume: the run's own config)"
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue this run from its latest checkpoint; 'auto': the recipe's run dir if it has one",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    p.add_argument(
        "--address",
        help="join an existing Ray cluster (default: $RAY_ADDRESS, else local, started only if needed)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the recipe, write its resolved config and print the placement plan; train nothing "
        "(train and --dry-run both warn first when the learner's step on the longest trajectory cannot fit)",
    )
    args = p.parse_args(argv)
    address = placement.cluster_address(args.address)  # --address, else $RAY_ADDRESS (as Ray's own tools)
    if args.recipe is None:
        if args.resume in (None, rundir.AUTO):
            p.error(
                "give a RECIPE (or --resume RUN_DIR to continue a run with the config it was started with)"
            )
        if args.set:
            p.error("--set needs the RECIPE too: agent-rl train RECIPE --resume RUN_DIR --set key=value")
        recipe = rundir.load_saved(Path(args.resume))
    else:
        recipe = load_recipe(args.recipe, args.set, check_model=True)
    from agent_rl.learners.memory import check_recipe  # before anything loads: will the learner's step fit?

    if (warning := check_recipe(recipe)) is not None:
        print(f"{args.recipe or args.resume}: {warning}", file=sys.stderr, flush=True)
    if args.dry_run:
        import envs

        envs.load(recipe.envs.train)
        run_dir, resuming = rundir.choose(recipe, args.resume)
        plan = placement.plan(recipe.engines, recipe.learner, recipe.placement, address)
        source = args.recipe or f"{run_dir}/{rundir.SAVED_CONFIG}"
        print(f"{source}: ok; run dir {run_dir} ({'resume' if resuming else 'new run'}); Ray: {plan.reason}")
        print(f"  resolved config: {rundir.write_resolved(recipe, run_dir, dry_run=True)}")
        for role in plan.roles:
            print(f"  {role.name}: {role.count} x ({role.cpus:g} CPU, {role.gpus:g} GPU)")
        print("\n".join(f"  {line}" for line in plan.describe()))
        return 0
    print(train(recipe, resume=args.resume, address=address))
    return 0
