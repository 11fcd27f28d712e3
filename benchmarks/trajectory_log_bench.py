"""What recording trajectories for `agent-rl view` costs on the main job: step time with the log on and off, size per step.

    .venv/bin/python benchmarks/trajectory_log_bench.py [--steps 40] [--repeats 2]

The main job's RL stage (recipes/tiny_tir.yaml from its SFT warm start at runs/tiny_tir/sft, which
`make run` writes) is run as `agent-rl train` in its own process, once per cell and repeat, cells
interleaved in a rotated order so machine noise hits all alike; eval and checkpoints are off so a
step is take + learner step + weight sync + logging:
- off: `logging.trajectories=0`;
- default: `logging.trajectories=16` (the default: 2 of the 8 groups per step);
- all: `logging.trajectories=all` (all 64 trajectories of every step).

Two measures of cost:
- in-run (the direct one): `perf/trajectory_log_seconds` (reading the learner's rows, encoding,
  compressing, appending) over `perf/step_seconds`, summed over the run's steps, in the same run;
- across runs: median `perf/step_seconds` of a cell / that of `off` in the same repeat, the median over repeats
  (includes everything the recording changes, but runs differ in episode lengths as their policies drift apart:
  noisy).

Size: bytes of data.bin + index.jsonl per step and per recorded trajectory.
Results: benchmarks/results/trajectory_log_bench.{json,md}, on benchmarks/harness (`plan`: cells rotated per
repeat; `Runner`: each finished run a line of WORK/steps<N>/runs.jsonl, a rerun resumes; its statistics,
provenance and writer); `--from-results FILE` rewrites them from a results file alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench_paths import ROOT

from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import log, quick_args, results_args, results_dir, rewrite, write
from benchmarks.harness.runner import Job, Runner, plan
from benchmarks.harness.stats import median_speedup
from benchmarks.harness.train import step_records, tiny_model, train

RECIPE = ROOT / "recipes" / "tiny_tir.yaml"
WARM = ROOT / "runs" / "tiny_tir" / "sft"
WORK = ROOT / "runs" / "trajectory_log_bench"
CELLS = {"off": "0", "default": "16", "all": "all"}


def run_cell(name: str, repeat: int, steps: int, model: Path = WARM, work: Path = WORK) -> dict[str, object]:
    run_dir = work / f"{name}_{repeat}"
    sets = [f"model.path={model}", f"logging.trajectories={CELLS[name]}", f"train.steps={steps}", "eval.every=0",
            "checkpoint.every=0", "monitor.on_warning=log", "logging.tensorboard=false"]  # fmt: skip
    wall = train(RECIPE, sets, run_dir)
    records = step_records(run_dir)
    step_s = [r["perf/step_seconds"] for r in records]
    log_s = [r.get("perf/trajectory_log_seconds", 0.0) for r in records]
    out: dict[str, object] = {
        "cell": name,
        "repeat": repeat,
        "run_dir": str(run_dir.relative_to(ROOT)) if run_dir.is_relative_to(ROOT) else str(run_dir),
        "steps": len(records),
        "wall_seconds": wall,
        "step_seconds_median": statistics.median(step_s),
        "step_seconds_sum": sum(step_s),
        "log_seconds_sum": sum(log_s),
        "log_seconds_max": max(log_s),
        "log_fraction_of_step": sum(log_s) / sum(step_s),
        "sampled_tokens_per_step": sum(r.get("learner/tokens", 0.0) for r in records) / len(records),
    }
    tdir = run_dir / "trajectories"
    if tdir.is_dir():
        index = [json.loads(line) for line in (tdir / "index.jsonl").read_text().splitlines()]
        total = (tdir / "data.bin").stat().st_size + (tdir / "index.jsonl").stat().st_size
        recorded = sum(s["trajectories"] for s in index)
        out |= {
            "bytes_total": total,
            "bytes_per_step_mean": total / len(index),
            "bytes_per_step_max": max(s["length"] for s in index),
            "bytes_raw_per_step_mean": sum(s["bytes_raw"] for s in index) / len(index),
            "trajectories_per_step": recorded / len(index),
            "bytes_per_trajectory": total / max(recorded, 1),
        }
    return out


def summarise(runs: list[dict[str, object]]) -> dict[str, dict[str, float]]:
    by: dict[str, list[dict[str, object]]] = {}
    for r in runs:
        by.setdefault(str(r["cell"]), []).append(r)
    off = {int(r["repeat"]): float(r["step_seconds_median"]) for r in by["off"]}  # type: ignore[arg-type]
    out = {}
    for name, rs in by.items():
        mine = {int(r["repeat"]): float(r["step_seconds_median"]) for r in rs}  # type: ignore[arg-type]
        s: dict[str, float] = {
            "runs": len(rs),
            "step_seconds_median": statistics.median(mine.values()),
            "step_time_vs_off": median_speedup(mine, off)[0],  # the median of the per-repeat ratios
            "log_fraction_of_step_mean": statistics.mean(float(r["log_fraction_of_step"]) for r in rs),  # type: ignore[arg-type]
            "log_fraction_of_step_max": max(float(r["log_fraction_of_step"]) for r in rs),  # type: ignore[arg-type]
            "log_seconds_max": max(float(r["log_seconds_max"]) for r in rs),  # type: ignore[arg-type]
        }
        if "bytes_per_step_mean" in rs[0]:
            for k in (
                "bytes_per_step_mean",
                "bytes_per_step_max",
                "bytes_raw_per_step_mean",
                "bytes_per_trajectory",
                "trajectories_per_step",
            ):
                s[k] = statistics.mean(float(r[k]) for r in rs)  # type: ignore[arg-type]
        out[name] = s
    return out


def markdown(d: dict) -> str:
    """The results page from the JSON alone."""
    meta, summary = d["meta"], d["summary"]
    when = f"{meta['command']}` on {meta['machine']}, {meta['date']}" if "machine" in meta else (
        f"{meta['command']}`, {describe(meta)}")  # before the harness: its own machine line  # fmt: skip
    lines = [
        "# Trajectory log: cost on the main job's step time, size per step",
        "",
        f"`{when}. Main job RL stage (recipes/tiny_tir.yaml,",
        "8 prompts x 8 samples per step, k=2, VCPO), eval and checkpoints off; cells interleaved.",
        "",
        "| cell | runs | median s/step | vs off | log time / step time (same run) | max log s | recorded traj./step | bytes/step (compressed) | raw bytes/step | bytes/traj. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in CELLS:
        s = summary[name]
        size = (
            f"{s['trajectories_per_step']:.0f} | {s['bytes_per_step_mean'] / 1024:.1f} KiB (max {s['bytes_per_step_max'] / 1024:.1f}) | "
            f"{s['bytes_raw_per_step_mean'] / 1024:.1f} KiB | {s['bytes_per_trajectory']:.0f}"
            if "bytes_per_step_mean" in s
            else "0 | – | – | –"
        )
        lines.append(
            f"| {name} | {s['runs']:.0f} | {s['step_seconds_median']:.3f} | {s['step_time_vs_off']:.3f}x | "
            f"{100 * s['log_fraction_of_step_mean']:.2f}% (max {100 * s['log_fraction_of_step_max']:.2f}%) | "
            f"{s['log_seconds_max'] * 1000:.1f} ms | {size} |"
        )
    lines += [
        "",
        "Read the in-run fraction: it times the recording itself inside the step it is part of. The across-run",
        "ratio (the median over repeats of a cell's median s/step over off's in the same repeat) also carries",
        "run-to-run noise (async timing and episode lengths differ between runs).",
    ]
    if "load_average_at_end" in meta:
        lines.append(
            f"Load average at the end (1/5/15 min): {', '.join(f'{x:.1f}' for x in meta['load_average_at_end'])}."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--model", type=Path, default=WARM, help="the warm start (default: the main job's, `make run`)"
    )
    p.add_argument("--work", type=Path, default=WORK)
    results_args(p, "trajectory_log_bench")
    quick_args(p, steps=2, repeats=1, model=None)  # no --model after it: a random tiny model (tiny_model)
    args = p.parse_args(argv)
    if rewrite(args, "trajectory_log_bench", markdown, lambda d: {"summary": summarise(d["runs"])}):
        return 0
    if args.model is None:
        args.model = tiny_model(args.work)
    if not (args.model / "config.json").is_file():
        print(
            f"{args.model} not found: run `make run` (or python -m examples.tiny_tir) first for the warm start",
            file=sys.stderr,
        )
        return 2
    prov = Provenance()

    def run(job: Job) -> dict:
        r = run_cell(job.cell, job.seed, args.steps, args.model, args.work)
        log(f"  median {r['step_seconds_median']:.3f} s/step, log {100 * float(r['log_fraction_of_step']):.2f}% of step time")  # type: ignore[arg-type]  # fmt: skip
        return r

    records = (
        Runner(args.work / f"steps{args.steps}").run(plan(list(CELLS), range(args.repeats)), run).records
    )
    runs = [{k: v for k, v in r.items() if k != "seed"} for r in records]
    out = results_dir(args.out, scratch=args.quick, name="trajectory_log_bench")
    write(
        "trajectory_log_bench", {"meta": prov.meta(), "summary": summarise(runs), "runs": runs}, out, markdown
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
