"""Which placement is faster for the main job: `placement.topology: inprocess` or `processes`.

    .venv/bin/python benchmarks/topology.py [--steps 20] [--seeds 2]

The main job's RL phase (recipes/tiny_tir.yaml, k=2 VCPO, from the warm start `make run` builds at
runs/tiny_tir/sft) run as `agent-rl train` with each topology, interleaved seed by seed so machine noise
hits both alike; in-run evaluation off. Reported: median s/step (take + learner step + weight sync),
learner and engine busy shares, weight-sync seconds, and the ratio processes / inprocess.
Results: benchmarks/results/topology.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from train_cmd import train_command

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
RECIPE = ROOT / "recipes" / "tiny_tir.yaml"
TOPOLOGIES = {
    "inprocess": ["placement.topology=inprocess"],
    "processes": ["placement.topology=processes", "engines.weight_sync=nccl"],
}


def run(topology: str, seed: int, steps: int, model: Path, work: Path) -> dict:
    run_dir = work / f"{topology}_s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = [
        f"model.path={model}",
        f"logging.run_dir={run_dir}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        "eval.every=0",
        "checkpoint.every=0",
        "logging.tensorboard=false",
        *TOPOLOGIES[topology],
    ]
    cmd = train_command(RECIPE, sets)
    t0 = time.monotonic()
    with open(work / f"{topology}_s{seed}.log", "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"{topology} seed {seed} failed (exit {rc}); log {work / f'{topology}_s{seed}.log'}")
    from agent_rl.metrics import read_metrics

    recs = [r for r in read_metrics(run_dir) if "perf/step_seconds" in r][
        1:
    ]  # step 0 includes the first fill
    return {
        "topology": topology,
        "seed": seed,
        "seconds_per_step": statistics.median(r["perf/step_seconds"] for r in recs),
        "learner_busy": statistics.mean(r["perf/learner_busy_fraction"] for r in recs),
        "engine_busy": statistics.mean(r["perf/engine_busy_fraction"] for r in recs),
        "weight_sync_seconds": sum(r["perf/weight_sync_seconds"] for r in recs),
        "process_wall_s": wall,  # the whole command: start-up (engine servers, learner process) included
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--model", type=Path, default=ROOT / "runs" / "tiny_tir" / "sft")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_topology")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no warm start at {args.model}: run `make run` first (it builds runs/tiny_tir/sft)")
    args.work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    rows = []
    for seed in range(args.seeds):
        order = list(TOPOLOGIES) if seed % 2 == 0 else list(reversed(TOPOLOGIES))
        for topology in order:
            print(f"[{time.strftime('%H:%M:%S')}] {topology} seed {seed}", flush=True)
            rows.append(run(topology, seed, args.steps, args.model, args.work))
    per = {
        t: {
            k: statistics.median(r[k] for r in rows if r["topology"] == t)
            for k in (
                "seconds_per_step",
                "learner_busy",
                "engine_busy",
                "weight_sync_seconds",
                "process_wall_s",
            )
        }
        for t in TOPOLOGIES
    }
    ratio = per["processes"]["seconds_per_step"] / per["inprocess"]["seconds_per_step"]
    # per seed (runs of one seed ran back to back): the spread says whether the difference is real
    by_seed = [
        next(r for r in rows if r["topology"] == "processes" and r["seed"] == s)["seconds_per_step"]
        / next(r for r in rows if r["topology"] == "inprocess" and r["seed"] == s)["seconds_per_step"]
        for s in range(args.seeds)
    ]
    faster = (
        "processes"
        if max(by_seed) < 1
        else "inprocess"
        if min(by_seed) > 1
        else "neither (within the seeds' spread)"
    )
    out = {
        "command": "benchmarks/topology.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average at start {load:.2f}",
        "steps": args.steps,
        "seeds": args.seeds,
        "runs": rows,
        "per_topology": per,
        "processes_over_inprocess_seconds_per_step": ratio,
        "per_seed_ratio": by_seed,
        "faster": faster,
    }
    lines = [
        "# Main job (recipes/tiny_tir.yaml, k=2): placement.topology inprocess vs processes",
        "",
        f"`{out['command'].strip()}`; {out['machine']}; {args.steps} steps x {args.seeds} seeds, interleaved.",
        "",
        "| topology | s/step (median) | learner busy | engine busy | weight sync s/run | whole command s |",
        "|---|---|---|---|---|---|",
        *(
            f"| {t} | {v['seconds_per_step']:.2f} | {v['learner_busy']:.2f} | {v['engine_busy']:.2f} | "
            f"{v['weight_sync_seconds']:.1f} | {v['process_wall_s']:.0f} |"
            for t, v in per.items()
        ),
        "",
        f"processes / inprocess s/step: **{ratio:.2f}x** (per seed {', '.join(f'{x:.2f}' for x in by_seed)}; "
        f"faster: {faster}). The whole command includes start-up: engine server and learner processes.",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "topology.json").write_text(json.dumps(out, indent=2) + "\n")
    (args.out / "topology.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
