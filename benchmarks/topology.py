"""Which placement is faster for the main job: `placement.topology: inprocess` or `processes`.

    .venv/bin/python benchmarks/topology.py [--steps 20] [--seeds 2]

The main job's RL phase (recipes/tiny_tir.yaml, k=2 VCPO, from the warm start `make run` builds at
runs/tiny_tir/sft) run as `agent-rl train` with each topology, interleaved seed by seed so machine noise
hits both alike; in-run evaluation off. Reported: median s/step (take + learner step + weight sync),
learner and engine busy shares, weight-sync seconds, and processes / inprocess s/step as the median of the
per-seed ratios. Results: benchmarks/results/topology.{json,md}.

On benchmarks/harness: `plan` (the topologies rotated seed by seed), `Runner` (each finished run one line of
WORK/runs.jsonl: a rerun with the same --steps resumes), its statistics, provenance and writer; `--from-results
FILE` rewrites the JSON and markdown from a results file alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench_paths import ROOT

from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import quick_args, results_args, results_dir, rewrite, table, write
from benchmarks.harness.runner import Runner, plan
from benchmarks.harness.stats import median_speedup, spread
from benchmarks.harness.train import step_records, tiny_model, train

RECIPE = ROOT / "recipes" / "tiny_tir.yaml"
METRICS = ("seconds_per_step", "learner_busy", "engine_busy", "weight_sync_seconds", "process_wall_s")
TOPOLOGIES = {
    "inprocess": ["placement.topology=inprocess"],
    "processes": ["placement.topology=processes", "engines.weight_sync=nccl"],
}


def run(topology: str, seed: int, steps: int, model: Path, work: Path) -> dict:
    run_dir = work / f"{topology}_s{seed}"
    sets = [
        f"model.path={model}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        "eval.every=0",
        "checkpoint.every=0",
        "monitor.on_warning=log",  # the main job's collapse guard off (it needs checkpoints): the topologies alone
        "logging.tensorboard=false",
        *TOPOLOGIES[topology],
    ]
    wall = train(RECIPE, sets, run_dir, name=f"{topology} seed {seed}")
    recs = step_records(run_dir)[1:]  # step 0 includes the first fill
    return {
        "topology": topology,
        "seed": seed,
        "seconds_per_step": statistics.median(r["perf/step_seconds"] for r in recs),
        "learner_busy": statistics.mean(r["perf/learner_busy_fraction"] for r in recs),
        "engine_busy": statistics.mean(r["perf/engine_busy_fraction"] for r in recs),
        "weight_sync_seconds": sum(r["perf/weight_sync_seconds"] for r in recs),
        "process_wall_s": wall,  # the whole command: start-up (engine servers, learner process) included
    }


def summarise(rows: list[dict]) -> dict:
    """Per topology the medians over seeds; processes / inprocess s/step seed by seed and their median."""
    per = {
        t: {k: spread(r[k] for r in rows if r["topology"] == t)["median"] for k in METRICS}
        for t in TOPOLOGIES
    }
    s_per_step = {
        t: {r["seed"]: r["seconds_per_step"] for r in rows if r["topology"] == t} for t in TOPOLOGIES
    }
    ratio, by_seed = median_speedup(s_per_step["processes"], s_per_step["inprocess"])
    faster = ("processes" if max(by_seed) < 1 else "inprocess" if min(by_seed) > 1
              else "neither (within the seeds' spread)")  # fmt: skip
    return {"per_topology": per, "processes_over_inprocess_seconds_per_step": ratio, "per_seed_ratio": by_seed,
            "faster": faster}  # fmt: skip


def markdown(d: dict) -> str:
    """The results page from the JSON alone."""
    when = describe(d["meta"]) if "meta" in d else d["machine"]  # before the harness: its own machine line
    command = d["meta"]["command"] if "meta" in d else d["command"]
    rows = [[t, f"{v['seconds_per_step']:.2f}", f"{v['learner_busy']:.2f}", f"{v['engine_busy']:.2f}",
             f"{v['weight_sync_seconds']:.1f}", f"{v['process_wall_s']:.0f}"] for t, v in d["per_topology"].items()]  # fmt: skip
    header = [
        "topology",
        "s/step (median)",
        "learner busy",
        "engine busy",
        "weight sync s/run",
        "whole command s",
    ]
    return "\n".join([
        "# Main job (recipes/tiny_tir.yaml, k=2): placement.topology inprocess vs processes",
        "",
        f"`{command.strip()}`; {when}; {d['steps']} steps x {d['seeds']} seeds, interleaved.",
        "",
        *table(header, rows),
        "",
        f"processes / inprocess s/step: **{d['processes_over_inprocess_seconds_per_step']:.2f}x** (the median of the "
        f"per-seed ratios {', '.join(f'{x:.2f}' for x in d['per_seed_ratio'])}; faster: {d['faster']}). The whole "
        "command includes start-up: engine server and learner processes.",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--model", type=Path, default=ROOT / "runs" / "tiny_tir" / "sft")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_topology")
    results_args(p, "topology")
    quick_args(p, steps=2, seeds=1, model=None)  # no --model after it: a random tiny model (tiny_model)
    args = p.parse_args(argv)
    if rewrite(args, "topology", markdown, lambda d: summarise(d["runs"])):
        return 0
    if args.model is None:
        args.model = tiny_model(args.work)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no warm start at {args.model}: run `make run` first (it builds runs/tiny_tir/sft)")
    prov = Provenance()
    work = args.work / f"steps{args.steps}"
    jobs = plan(list(TOPOLOGIES), range(args.seeds))
    records = Runner(work).run(jobs, lambda j: run(j.cell, j.seed, args.steps, args.model, work)).records
    rows = [{k: v for k, v in r.items() if k != "cell"} for r in records]
    d = {"meta": prov.meta(), "steps": args.steps, "seeds": args.seeds, "runs": rows, **summarise(rows)}
    write("topology", d, results_dir(args.out, scratch=args.quick, name="topology"), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
