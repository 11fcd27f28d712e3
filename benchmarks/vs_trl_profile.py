"""Where each core's time goes in a step, agent-rl beside TRL on agent_arith (issue 62, item 1).

    .venv/bin/python benchmarks/vs_trl_profile.py [--quick] [--steps 10] [--seeds 1]

The same job, warm start, cores (`taskset -c 0,1`) and runner as benchmarks/vs_trl.py, for a few steps per
cell, the cells interleaved (seed by seed, rotated), no scoring: what each step costs and where. Per cell:
- the step's wall time split into phases, each system by its own clock: agent-rl's trainer (waiting for the
  batch, the learner and within it forward / optimizer / the rest = backward and the loss, weight sync, the
  driver's rest) and TRL's (benchmarks/trl_run.py: generation, tool calls, reward, forward+backward,
  optimizer, the rest); TRL runs one phase at a time, so its phases' process-CPU seconds are given too;
- CPU seconds per step by the role that owns each thread (benchmarks/_core_profile.py, sampled from /proc):
  engine, learner, driver (agent-rl's trainer loop, episodes, gateway, HTTP), tools (the sandboxes), trl;
  over steps 2..N, so start-up and the first step's warm-up are left out;
- cores busy in that window (CPU seconds / wall seconds: 2.0 is both cores all the time), and the machine's
  load average before and after the run (other users' jobs slow every cell; the interleaving shares it out).
Ratios are within this invocation only (each the median over seeds of the per-seed ratios). Results:
benchmarks/results/vs_trl_profile.{json,md} (--quick: runs/bench/vs_trl/vs_trl_profile_quick.*, a machinery check on
the small warm start); `--from-results FILE` rewrites FILE's summary and page from its runs alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _agent_arith import warm_start  # noqa: E402
from vs_trl import (  # noqa: E402
    CORES,
    K_ASYNC,
    ROOT,
    Config,
    finished,
    log,
    relative_args,
    step_records,
    train,
)

from benchmarks.harness.provenance import Provenance, portable  # noqa: E402
from benchmarks.harness.report import results_args, results_dir, table, write  # noqa: E402
from benchmarks.harness.runner import plan as run_order  # noqa: E402
from benchmarks.harness.stats import median_or_none, ratio  # noqa: E402


def cells(quick: bool = False) -> list[Config]:
    """What the profile runs: TRL's fastest tuned cell of the last full run (2 threads, 1 micro-batch: first, the
    baseline of the ratios), agent-rl's tuned cells of that run (k=0 in-process on 1 thread, k=2 the processes
    topology, both with the recipe's learner micro-batch of 4), and the candidates of issue 62's item 2: the
    learner's micro-batch a whole step (64: one pass per step and no forward-only pass for the proxy baseline,
    which a micro-batch smaller than a group of 8 costs), 2 threads in-process, the k=2 learner on both cores.
    --quick (a machinery check, in CI): TRL's, agent-rl's in-process cell and the last, which between them take
    every way of running (in-process, processes, the learner's cores and micro-batch)."""
    every = [
        Config("trl", "closest", 0, 2, micro_batches=1),
        Config("agent-rl", "vcpo", 0, 1, "inprocess"),
        Config("agent-rl", "vcpo", K_ASYNC, None, "processes"),
        Config("agent-rl", "vcpo", 0, 1, "inprocess", learner_micro_batch=64),
        Config("agent-rl", "vcpo", 0, 2, "inprocess", learner_micro_batch=64),
        Config("agent-rl", "vcpo", K_ASYNC, None, "processes", learner_micro_batch=64),
        Config("agent-rl", "vcpo", K_ASYNC, None, "processes", learner_cores=CORES, learner_micro_batch=64),
    ]
    return [every[i] for i in (0, 1, 6)] if quick else every


def key(c: Config) -> str:
    return f"{c.name} ({c.label})"


def phases(steps: list[dict], system: str) -> dict[str, float]:
    """Mean seconds per step of each phase over steps 2..N (TRL: also process-CPU seconds, `cpu_*`)."""
    rows = steps[1:] or steps
    mean = {k: statistics.fmean(r.get(k, 0.0) for r in rows) for k in rows[0]}
    if system == "trl":
        out = {k.removeprefix("phase_"): v for k, v in mean.items() if k.startswith("phase_")}
        out["step"] = mean["step_seconds"]
        return out
    out = {
        "wait": mean["wait"],
        "learner": mean["learner"],
        "weight_sync": mean["weight_sync"],
        "driver_rest": mean["rest"],
        "step": mean["step_seconds"],
    }
    if "learner_forward" in mean:
        out["learner_forward"] = mean["learner_forward"]
        out["learner_optimizer"] = mean["learner_optimizer"]
        out["learner_backward_rest"] = mean["learner"] - mean["learner_forward"] - mean["learner_optimizer"]
    return out


def timed(c: Config, seed: int, model: Path, d: Path, steps: int, trl_py: Path) -> tuple[object, list, bool]:
    """One run (train's resume reuses one that finished before) with the load average before and after it: kept
    beside the run (D.load.json), so that a reused run reports the loads it ran under, not this invocation's."""
    kept = d.with_suffix(".load.json")
    if finished(d, c, seed, steps) is not None:
        run = train(c, seed, model, d, steps, steps, trl_py)
        return run, json.loads(kept.read_text()) if kept.is_file() else [None, None], True
    before = os.getloadavg()[0]
    run = train(c, seed, model, d, steps, steps, trl_py)
    load = [before, os.getloadavg()[0]]
    kept.write_text(json.dumps(load))
    return run, load, False


def record(c: Config, seed: int, run, load: list, reused: bool = False) -> dict:
    steps = step_records(run)
    times = sorted(r["step_seconds"] for r in steps[1:])
    cpu = run.cpu_per_step or {}
    busy = sum(v for k, v in cpu.items() if k not in ("wall", "steps"))
    return {
        "cell": key(c),
        "system": c.system,
        "seed": seed,
        "steps": len(steps),
        "s_per_step": times[len(times) // 2] if times else None,
        "phases_s": phases(steps, c.system),
        "cpu_s_per_step": {k: v for k, v in cpu.items() if k not in ("wall", "steps")},
        "window_steps": cpu.get("steps"),
        "cores_busy": busy / cpu["wall"] if cpu.get("wall") else None,
        "process_wall_s": run.process_wall_s,
        "cpu_s": run.cpu_s,
        "load_before_after": load,
        "reused": reused,
    }


def summary(records: list[dict]) -> dict:
    """Per cell: medians over seeds; and the in-run ratios against TRL's fastest cell (2 threads): per cell, the median
    over seeds of its s/step over that cell's at the same seed."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["cell"], []).append(r)
    cellsum = {}
    for name, rs in by.items():
        cellsum[name] = {
            "s_per_step": statistics.median(r["s_per_step"] for r in rs),
            "cores_busy": statistics.median(r["cores_busy"] for r in rs if r["cores_busy"] is not None)
            if any(r["cores_busy"] is not None for r in rs)
            else None,
            "cpu_s_per_step": {
                role: statistics.median(r["cpu_s_per_step"].get(role, 0.0) for r in rs)
                for role in sorted({k for r in rs for k in r["cpu_s_per_step"]})
            },
            "phases_s": {
                ph: statistics.median(r["phases_s"].get(ph, 0.0) for r in rs) for ph in rs[0]["phases_s"]
            },
        }
    trl = key(cells()[0])
    trl_s = {r["seed"]: r["s_per_step"] for r in by.get(trl, [])}
    ratios = {}  # the median of the per-seed ratios (benchmarks/harness/stats.py), never a ratio of medians
    for name, rs in by.items() if trl_s else ():
        med = median_or_none(ratio(r["s_per_step"], trl_s.get(r["seed"])) for r in rs)
        ratios[name] = None if med is None else round(med, 3)
    return {"cells": cellsum, "s_per_step_over_trl_fastest": ratios, "trl_fastest": trl}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(out: dict) -> str:
    s = out["summary"]
    lines = [
        "# Where each core's time goes: agent-rl vs TRL on agent_arith (one invocation, interleaved)",
        "",
        f"`{out['command']}`, {out['date']}; {out['machine']}. {out['steps']} steps per run, {out['seeds']} "
        f"seed(s); warm start: {out['warm_start']}. Per step figures over steps 2..N.",
        "",
        "**CPU seconds per step by role** (threads grouped by the role that owns them, sampled from /proc; "
        "cores busy = CPU s / wall s, 2.0 = both cores all the time):",
        "",
    ]
    roles = sorted({r for v in s["cells"].values() for r in v["cpu_s_per_step"]})
    rows = []
    for name, v in s["cells"].items():
        cpu = v["cpu_s_per_step"]
        rows.append(
            [name, f"{v['s_per_step']:.2f}", fmt(s["s_per_step_over_trl_fastest"].get(name))]
            + [f"{cpu.get(r, 0.0):.2f}" for r in roles]
            + [f"{sum(cpu.values()):.2f}", "-" if v["cores_busy"] is None else f"{v['cores_busy']:.2f}"]
        )
    lines += table(
        ["cell", "s/step (median)", f"over {s['trl_fastest']}", *roles, "CPU s/step", "cores busy"], rows
    )
    lines += ["", "**Wall seconds per step by phase** (each system's own clock; mean over steps 2..N):", ""]
    rows = []
    for name, v in s["cells"].items():
        rows.append([name, ", ".join(f"{k} {x:.2f}" for k, x in v["phases_s"].items())])
    lines += table(["cell", "phases (s)"], rows)
    lines += ["", "Per run:", ""]
    lines += table(
        ["cell", "seed", "s/step", "cores busy", "load before, after"],
        [
            [
                r["cell"],
                r["seed"],
                f"{r['s_per_step']:.2f}",
                "-" if r["cores_busy"] is None else f"{r['cores_busy']:.2f}",
                "- (reused; not kept)"
                if r["load_before_after"][0] is None
                else f"{r['load_before_after'][0]:.1f}, {r['load_before_after'][1]:.1f}",
            ]
            for r in out["runs"]
        ],
    )
    lines += [
        "",
        "Roles: engine (the embedded engine: its server process, or its thread and that thread's torch workers "
        "in-process), learner (the learner's process, or in-process the trainer's main thread and its torch "
        "workers), driver (agent-rl's trainer loop in the processes topology, the rollout loop: episodes, "
        "gateway, HTTP, tokenizing), tools (the bubblewrap sandboxes), trl (TRL's one process: its phases "
        "above split it). TRL phases with a `cpu_` prefix are process-CPU seconds of that phase (TRL runs one "
        "phase at a time).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="small warm start, 4 of the cells, 4 steps, 1 seed: a machinery check",
    )
    p.add_argument("--steps", type=int, default=None, help="steps per cell (default 10; --quick 4)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--trl-venv", type=Path, default=ROOT / ".venv-trl")
    p.add_argument(
        "--work", type=Path, default=None, help="default: runs/bench_vs_trl[_quick] (shares the warm start)"
    )
    results_args(p, "vs_trl_profile")
    args = p.parse_args(argv)
    if args.from_results is not None:  # any vs_trl_profile*.json, rewritten under its own name
        d = json.loads(args.from_results.read_text())
        out_dir = results_dir(args.out, scratch=False, name="vs_trl")
        write(args.from_results.stem, d | {"summary": summary(d["runs"])}, out_dir, markdown)
        return 0
    args.steps = args.steps or (4 if args.quick else 10)
    work = args.work or ROOT / "runs" / ("bench_vs_trl_quick" if args.quick else "bench_vs_trl")
    out_dir = results_dir(args.out, scratch=args.quick, name="vs_trl")
    trl_py = args.trl_venv / "bin" / "python"
    if not trl_py.is_file():
        raise SystemExit(f"no TRL environment at {args.trl_venv}: run `bash scripts/setup_trl.sh` first")
    work.mkdir(parents=True, exist_ok=True)
    # before the warm start, whose SFT would be the load "at the start"
    prov = Provenance(venvs={"trl": trl_py})
    log("warm start: the agent_arith pipeline's model + SFT (cached)")
    model = warm_start(work, scale=0.1 if args.quick else 1.0).resolve()
    by_key = {key(c): c for c in cells(args.quick)}
    runs = []
    jobs = run_order(list(by_key), range(args.seeds))
    for i, job in enumerate(jobs):
        c = by_key[job.cell]
        log(f"[{i + 1}/{len(jobs)}] {job.cell} seed {job.seed}")
        d = (
            work
            / "profile"
            / f"{c.name} {c.label} s{job.seed}".replace(" ", "_").replace(",", "").replace("=", "")
        )
        runs.append(record(c, job.seed, *timed(c, job.seed, model, d, args.steps, trl_py)))
        log(f"  {runs[-1]['s_per_step']:.2f} s/step, cpu/step {runs[-1]['cpu_s_per_step']}")
    reused, meta = sum(r["reused"] for r in runs), prov.meta()
    out = {
        "command": "benchmarks/vs_trl_profile.py " + relative_args(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} cores; both systems pinned to cores {CORES}; load average "
        f"{meta['load_before'][0]:.2f} at start, {meta['load_after'][0]:.2f} at the end (other users of the machine "
        "included)"
        + (
            f"; {reused} of {len(runs)} runs finished in an earlier invocation in {portable(str(work))} and were reused "
            "(their own loads per run below; delete that folder's profile/ to measure anew)"
            if reused
            else ""
        ),
        "meta": meta,
        "warm_start": "quick (10% of the SFT data, 1 epoch)" if args.quick else "the agent_arith pipeline's",
        "steps": args.steps,
        "seeds": args.seeds,
        "runs": runs,
        "summary": summary(runs),
    }
    write("vs_trl_profile_quick" if args.quick else "vs_trl_profile", out, out_dir, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
