"""THE training loop, top to bottom (`agent-rl train RECIPE`).

Rollout workers run all the time on a background event loop and fill the buffer; this
loop is the learner's side only. Asynchrony is the buffer's business (its staleness bound
k and admission control), so k=0 (synchronous, on-policy) and k>0 run the same lines.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from agent_rl import checkpoint, evaluate, placement, rundir
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import Recipe
from agent_rl.loop_thread import LoopThread
from agent_rl.metrics import RunWriter
from agent_rl.monitor import LoopMonitor
from agent_rl.rollout.workers import PromptSource, Rollouts
from agent_rl.viewer.log import TrajectoryLog
from agent_rl.weights.publish import WeightSync


def train(recipe: Recipe, *, resume: str | Path | None = None, address: str | None = None) -> Path:
    """Train `recipe`; with `resume`, continue that run directory ("auto": the recipe's own, if it has a
    checkpoint) from its latest checkpoint. Returns the run dir."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    import envs
    from agent_rl.learners import build as build_learner

    run_dir, resuming = rundir.choose(recipe, resume)  # a fresh run never writes into an old run's dir
    if resuming:
        rundir.warn_on_differences(run_dir, recipe)
    rundir.announce(run_dir, recipe, resuming)
    plan = placement.plan(recipe.engines, recipe.learner, recipe.placement, address)
    placement.apply(plan)  # Ray only if the plan needs it
    spec = envs.load(recipe.envs.train)
    tokenizer = AutoTokenizer.from_pretrained(recipe.model.tokenizer or recipe.model.path)
    lag = recipe.rollout.fixed_lag  # research switch: engines sample with weights exactly `lag` versions old
    bcfg = recipe.buffer if lag is None else recipe.buffer.model_copy(update={"max_staleness": lag})
    buffer = RolloutBuffer(
        bcfg,
        batch_prompts=recipe.train.batch_prompts,
        group_size=spec.group_size,
        admit_lag=None if lag is None else 0,
    )
    with ExitStack() as cleanup:  # whatever was started is stopped, in reverse order, however we leave
        loop = LoopThread()  # buffer, engines, sandbox and episodes all live on this event loop
        cleanup.callback(loop.close)
        spec, service = loop.call(placement.place_sandbox(plan, spec))  # placement.sandbox: a service on its node
        cleanup.callback(lambda: service and loop.call(placement.stop_server(service)))
        sandbox = envs.make_sandbox(spec)
        cleanup.callback(lambda: loop.call(sandbox.close()))
        prompts = PromptSource(envs.make(spec, tokenizer, sandbox).tasks("train"), seed=recipe.train.seed)
        learner = build_learner(recipe, rank_cores=plan.cores.learner_ranks if plan.cores else None)
        cleanup.callback(learner.close)
        start, lagged = 0, []
        if resuming:
            state = checkpoint.load(checkpoint.latest(run_dir), learner)
            buffer.load_state(state.buffer)
            prompts.load_state(state.prompts)
            start, lagged = state.step, state.lagged_weights
            checkpoint.truncate_logs(run_dir, start)
        engines = loop.call(
            placement.start_engines(plan, recipe.engines, recipe.model, seed=recipe.train.seed, run_dir=run_dir)
        )
        sync = WeightSync(
            engines.client,
            loop,
            mode=recipe.engines.weight_sync,
            lag=lag or 0,
            every=recipe.engines.sync_every,
            scratch=run_dir / "w",
        )
        sync.history.extend(lagged)
        sync.push(
            learner
        )  # before step 1: a broken weight path fails now, not after the first optimizer step
        loop.call(_set_version(buffer, learner.version))
        make_env = lambda: envs.make(spec, tokenizer, sandbox)  # noqa: E731 - one Env per episode
        rollouts = Rollouts(
            recipe.rollout, buffer, prompts, make_env, engines.client,
            max_seq_len=recipe.engines.max_seq_len, seed=recipe.train.seed,
        )  # fmt: skip
        loop.call(_start(rollouts))
        cleanup.callback(lambda: loop.call(_shutdown(rollouts, engines)))
        cleanup.callback(sync.close)  # nccl: engines leave the run's weight group (runs before they close)
        writer = cleanup.enter_context(
            RunWriter(run_dir, recipe, backends=recipe.logging.sinks, project=recipe.logging.project)
        )
        trajectories = TrajectoryLog(
            run_dir, recipe.logging.trajectories, tokenizer=recipe.model.tokenizer or recipe.model.path,
            is_truncation=recipe.algorithm.is_truncation, seed=recipe.train.seed, start=start,
        )  # fmt: skip
        bar = cleanup.enter_context(
            tqdm(range(start, recipe.train.steps), initial=start, total=recipe.train.steps, desc=recipe.name)
        )
        monitor = LoopMonitor(recipe.monitor, bcfg.max_staleness)  # collapse early warning
        for step in bar:
            t0 = time.monotonic()
            batch = loop.call(buffer.take(recipe.train.batch_prompts))
            t_wait = time.monotonic() - t0
            metrics = dict(learner.step(batch))
            t_learn = time.monotonic() - t0 - t_wait
            sync_s = sync.push(learner)  # engines pause, abort in-flight turns, load, resume
            metrics |= loop.call(_set_version(buffer, learner.version)) | loop.call(_stats(rollouts))
            metrics["perf/trajectory_log_seconds"] = trajectories.append(step, batch, learner, metrics)
            rewards = [r for g in batch for r in g.rewards]
            step_s = time.monotonic() - t0
            metrics |= {
                "rollout/reward_mean": sum(rewards) / len(rewards),
                "perf/step_seconds": step_s,
                "perf/wait_seconds": t_wait,
                "perf/weight_sync_seconds": sync_s,
                "perf/learner_busy_fraction": t_learn / step_s,
                "learner/version": learner.version,
            }
            response = monitor.observe(step, metrics)  # monitor.on_warning: log/stop/rollback/adapt
            metrics |= response.metrics
            if response.staleness_bound is not None:
                loop.call(_set_bound(buffer, response.staleness_bound))
            if recipe.eval.every and (step + 1) % recipe.eval.every == 0:
                metrics |= loop.call(
                    evaluate.evaluate_envs(
                        evaluate.eval_specs(recipe.envs), recipe.eval, recipe.rollout, engines.client,
                        tokenizer, sandbox, max_seq_len=recipe.engines.max_seq_len, seed=recipe.train.seed,
                    )
                )  # fmt: skip
                # the engines' version: under rollout.fixed_lag it is k behind the learner's (learner/version)
                metrics["eval/policy_version"] = float(sync.engine_version or 0)
            writer.log(step, metrics)
            _log_batch(run_dir, step, batch)
            bar.set_postfix(
                reward=f"{metrics['rollout/reward_mean']:.3f}",
                ess=f"{metrics.get('vcpo/ess_ratio', 1.0):.2f}",
                stale=f"{metrics.get('buffer/staleness_mean', 0.0):.1f}",
                tok_s=f"{metrics['perf/rollout_tokens_per_s']:.0f}",
            )
            every = recipe.checkpoint.every or recipe.train.steps
            if response.stop or (step + 1) % every == 0 or step + 1 == recipe.train.steps:
                state = loop.call(_loop_state(step + 1, prompts, buffer))
                state.lagged_weights = list(sync.history)
                checkpoint.save(
                    run_dir, learner, state, model_dir=Path(recipe.model.path), keep=recipe.checkpoint.keep,
                    tokenizer=tokenizer,  # the export carries the tokenizer this run used (model.tokenizer)
                )  # fmt: skip
            if response.stop:
                print(f"{recipe.name}: {response.message}", file=sys.stderr, flush=True)
                break
            if response.rollback:  # restored weights and optimizer, lower lr, published as a new version
                monitor.rollback(run_dir, learner, sync, response.warning)
                sync.push(learner)
                loop.call(_set_version(buffer, learner.version))
    return run_dir


# Small coroutines so that every touch of the buffer happens on the rollout loop's thread.
async def _set_version(buffer: RolloutBuffer, version: int) -> dict[str, float]:
    stats = buffer.stats()  # staleness of the batch just taken, measured against the version it trained
    buffer.set_version(version)
    return stats


async def _set_bound(buffer: RolloutBuffer, k: int) -> None:
    buffer.set_bound(k)


async def _start(rollouts: Rollouts) -> None:
    rollouts.start()


async def _stats(rollouts: Rollouts) -> dict[str, float]:
    return rollouts.stats()


async def _loop_state(step: int, prompts: PromptSource, buffer: RolloutBuffer) -> checkpoint.LoopState:
    return checkpoint.LoopState(step, prompts.state(), buffer.state())  # one consistent snapshot


async def _shutdown(rollouts: Rollouts, engines: placement.Engines) -> None:
    await engines.close()  # first: cancelling episodes mid-call into a live engine would race its thread
    await rollouts.stop()


def _log_batch(run_dir: Path, step: int, batch) -> None:
    """batches.jsonl: which prompts and trajectories each step trained on (audit trail for resume tests)."""
    record = {
        "step": step,
        "tasks": [g.trajectories[0].task_id for g in batch],
        "uids": [t.uid for g in batch for t in g.trajectories],
        "sampled_tokens": [t.num_sampled for g in batch for t in g.trajectories],  # length-bias audits
        "turns": [len(t.turns) for g in batch for t in g.trajectories],
        "versions": [
            _runs(t) for g in batch for t in g.trajectories
        ],  # [version, tokens] runs per trajectory
    }
    with open(run_dir / "batches.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _runs(traj) -> list[list[int]]:
    """The policy versions of a trajectory's sampled tokens, run-length encoded: [[version, count], ...]."""
    out: list[list[int]] = []
    for v in (v for s in traj.segments for v in (s.versions or ())):
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


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
    p.add_argument("--dry-run", action="store_true", help="validate the recipe and print the placement plan")
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
    if args.dry_run:
        import envs

        envs.load(recipe.envs.train)
        run_dir, resuming = rundir.choose(recipe, args.resume)
        plan = placement.plan(recipe.engines, recipe.learner, recipe.placement, address)
        source = args.recipe or f"{run_dir}/{rundir.SAVED_CONFIG}"
        print(f"{source}: ok; run dir {run_dir} ({'resume' if resuming else 'new run'}); Ray: {plan.reason}")
        for role in plan.roles:
            print(f"  {role.name}: {role.count} x ({role.cpus:g} CPU, {role.gpus:g} GPU)")
        print("\n".join(f"  {line}" for line in plan.describe()))
        return 0
    print(train(recipe, resume=args.resume, address=address))
    return 0
