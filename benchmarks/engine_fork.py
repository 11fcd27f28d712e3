"""What copying prompt keys between running requests saves a training step: `engines.copy_prefixes` on and off.

    .venv/bin/python benchmarks/engine_fork.py [--steps 20] [--seeds 3]

The agent_arith job of benchmarks/vs_trl.py (recipes/agent_arith.yaml from the same warm start, 8 prompts x 8
samples a step, two model calls an episode, the learner's whole-step micro-batch) in vs_trl's two agent-rl
topologies: async k=2 with the engine and learner in processes of their own (weights by NCCL/gloo), and sync
k=0 in one process on one thread. Each with the embedded engine copying a running request's prompt keys into
the requests that share them (a GRPO group's other members; engines/embedded/prefixes.py) and with every prompt
prefilled whole (`engines.copy_prefixes=false`); the cells interleaved and rotated seed by seed, pinned to cores
0,1 as vs_trl pins them. Reported: the mean step (steps 2..N: the wait for the batch, the learner, the weight
push), the wait for the batch (generation not hidden behind the learner), the whole command's wall time, and
copy / whole as the median of the per-seed ratios. Results: benchmarks/results/engine_fork.{json,md}.

On benchmarks/harness: `plan` (rotated), `Runner` (resume by run; a rerun with the same --steps skips the runs
done), provenance, statistics and writer; `--from-results FILE` rewrites the JSON and page from its runs alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from _agent_arith import warm_start
from bench_paths import ROOT

from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import log, quick_args, results_args, results_dir, rewrite, table, write
from benchmarks.harness.runner import Runner, plan
from benchmarks.harness.stats import median_speedup, spread
from benchmarks.harness.train import step_records, train

RECIPE = ROOT / "recipes" / "agent_arith.yaml"
CORES = "0,1"  # vs_trl.py's pinning
TOPOLOGIES = {  # vs_trl's agent-rl cells, with the learner's whole-step micro-batch (8 x 8 samples)
    "k=2 processes": ["buffer.max_staleness=2", "placement.topology=processes", "engines.weight_sync=nccl"],
    "k=0 inprocess 1 thread": ["buffer.max_staleness=0", "placement.topology=inprocess"],
}
SETTINGS = {"copy": "engines.copy_prefixes=true", "whole": "engines.copy_prefixes=false"}
CELLS = [f"{t}, {s}" for t in TOPOLOGIES for s in SETTINGS]
METRICS = ("step_s", "wait_s", "process_s")


def run(cell: str, seed: int, steps: int, model: Path, work: Path) -> dict:
    topology, setting = cell.split(", ")
    run_dir = work / f"{topology.replace(' ', '_').replace('=', '')}_{setting}_s{seed}"
    sets = [
        f"model.path={model}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        "learner.micro_batch_size=64",
        "eval.every=0",
        "checkpoint.every=0",
        "logging.trajectories=0",
        "logging.tensorboard=false",
        SETTINGS[setting],
        *TOPOLOGIES[topology],
    ]
    env = os.environ | ({"OMP_NUM_THREADS": "1"} if "1 thread" in topology else {})
    wall = train(RECIPE, sets, run_dir, env=env, name=f"{cell} seed {seed}", cores=CORES)
    recs = step_records(run_dir)[1:]  # step 0 includes the first fill
    return {
        "cell": cell,
        "seed": seed,
        "step_s": statistics.mean(r["perf/step_seconds"] for r in recs),
        "wait_s": statistics.mean(r["perf/wait_seconds"] for r in recs),
        "reward": statistics.mean(r["rollout/reward_mean"] for r in recs),
        "process_s": wall,  # the whole command: start-up and the last checkpoint included
    }


def summarise(rows: list[dict]) -> dict:
    """Per cell the medians over seeds; per topology copy / whole mean step and wait, seed by seed and their median."""
    per = {
        c: {k: spread(r[k] for r in rows if r["cell"] == c)["median"] for k in (*METRICS, "reward")}
        for c in CELLS
    }
    ratios = {}
    for t in TOPOLOGIES:
        out = {}
        for k in ("step_s", "wait_s"):
            side = {s: {r["seed"]: r[k] for r in rows if r["cell"] == f"{t}, {s}"} for s in SETTINGS}
            ratio, by_seed = median_speedup(side["copy"], side["whole"])
            out[k] = {"median": ratio, "per_seed": by_seed}
        ratios[t] = out
    return {"per_cell": per, "copy_over_whole": ratios}


def markdown(d: dict) -> str:
    """The results page from the JSON alone."""
    rows = [[c, f"{v['step_s']:.2f}", f"{v['wait_s']:.2f}", f"{v['process_s']:.0f}", f"{v['reward']:.2f}"]
            for c, v in d["per_cell"].items()]  # fmt: skip
    lines = [
        "# Copying prompt keys between running requests (`engines.copy_prefixes`), agent_arith",
        "",
        f"`{d['meta']['command'].strip()}`; {describe(d['meta'])}; {d['steps']} steps x {d['seeds']} seed(s), "
        "the cells interleaved; pinned to cores 0,1.",
        "",
        *table(
            ["cell", "s/step (mean, steps 2..N)", "wait for the batch s", "whole command s", "reward"], rows
        ),
        "",
    ]
    for t, r in d["copy_over_whole"].items():
        step, wait = r["step_s"], r["wait_s"]
        lines.append(
            f"- {t}: copy / whole mean step **{step['median']:.2f}x** (per seed "
            f"{', '.join(f'{x:.2f}' for x in step['per_seed'])}), wait for the batch {wait['median']:.2f}x."
        )
    lines += [
        "",
        "Medians over seeds of each run's mean; ratios are medians of the per-seed ratios (same seed, same tasks). "
        "reward: the mean training reward over steps 2..N (the same job learns the same either way).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--work", type=Path, default=None, help="default: runs/bench_vs_trl[_quick] (its warm start)"
    )
    results_args(p, "engine_fork")
    quick_args(p, steps=3, seeds=1)
    args = p.parse_args(argv)
    if rewrite(args, "engine_fork", markdown, lambda d: summarise(d["runs"])):
        return 0
    work = args.work or ROOT / "runs" / ("bench_vs_trl_quick" if args.quick else "bench_vs_trl")
    prov = Provenance()
    log("warm start: the agent_arith pipeline's model + SFT (cached)")
    model = warm_start(work, scale=0.1 if args.quick else 1.0).resolve()
    runs = work / "engine_fork" / f"steps{args.steps}"
    jobs = plan(CELLS, range(args.seeds))
    records = Runner(runs).run(jobs, lambda j: run(j.cell, j.seed, args.steps, model, runs)).records
    d = {"meta": prov.meta(), "steps": args.steps, "seeds": args.seeds, "runs": records, **summarise(records)}
    write("engine_fork", d, results_dir(args.out, scratch=args.quick, name="engine_fork"), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
