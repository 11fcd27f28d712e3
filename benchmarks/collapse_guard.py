"""The main job's collapse guard: the same runs with the guard (monitor.on_warning=rollback) and without (log).

    PYTHONPATH=. .venv/bin/python benchmarks/collapse_guard.py [--lr 3e-4] [--seeds 0 1 2 3]
        [--time-limit-s S] [--work DIR] [--out DIR]

Each (cell, seed) is one run of `python -m examples.tiny_tir` (the README's main job, recipes/tiny_tir.yaml) with
`--set monitor.on_warning=CELL --set train.seed=SEED --set learner.lr=LR` under its own name, all from one SFT
warm start (the recipe's model.path, runs/tiny_tir/sft: built by the first run that finds none, then shared).
Both cells checkpoint alike (the recipe's checkpoint.every), so they differ in the response alone: `log` records
the warning and trains on; `rollback` reloads the checkpoint from before the policy that sampled the reward's
peak and halves the lr (docs/guides/monitor.md). At the recipe's lr about one run in ten collapses (too few to
compare in an evening); a higher `--lr` makes collapses common, which is what a guard is for.

Recorded per run: held-out accuracy before and after RL (100 tasks), collapsed (after below before), the
monitor's first warning step and rollbacks made, the run's wall seconds. Reported per cell: mean ± SE of the
after-RL accuracy and the collapses; rollback − log paired by seed with the 2-SE words. The runs go through the
benchmark harness (seed-major, cells rotated, resumable from WORK/runs.jsonl, `--time-limit-s` drains).
Writes benchmarks/results/collapse_guard[_lrLR].{json,md} (a run with --out writes there instead;
--from-results FILE rewrites a page from its JSON alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.provenance import ROOT, Provenance  # noqa: E402
from benchmarks.harness.report import RESULTS, results_args, table, write  # noqa: E402
from benchmarks.harness.runner import Job, Runner, plan  # noqa: E402
from benchmarks.harness.stats import mean_se, paired  # noqa: E402
from benchmarks.harness.train import run_logged  # noqa: E402

NAME = "collapse_guard"
CELLS = ("log", "rollback")
RECIPE_LR = 3e-4  # recipes/tiny_tir.yaml's learner.lr


def results_name(lr: float) -> str:
    return NAME if lr == RECIPE_LR else f"{NAME}_lr{lr:g}"


def run_one(job: Job, lr: float, logs: Path) -> dict:
    """One main job; its report's accuracies, what the monitor did (from metrics.jsonl), its wall time."""
    from agent_rl.metrics import read_metrics

    name = f"{results_name(lr)}_{job.cell}_s{job.seed}"
    sets = [f"name={name}", f"train.seed={job.seed}", f"monitor.on_warning={job.cell}", f"learner.lr={lr}"]
    cmd = [sys.executable, "-m", "examples.tiny_tir", "--fresh", *(x for s in sets for x in ("--set", s))]
    seconds = run_logged(cmd, logs / f"{job.cell}_s{job.seed}.log", f"{NAME}: {job.key}")
    run = ROOT / "runs" / name
    report = json.loads((run / "report.json").read_text())
    steps = read_metrics(run / "rl")
    warned = [r["step"] for r in steps if r.get("monitor/warning")]
    before, after = report["before"]["accuracy"], report["after"]["accuracy"]
    return {
        "before": before, "after": after, "collapsed": after < before, "seconds": round(seconds, 1),
        "first_warning": warned[0] if warned else None,
        "rollbacks": int(max((r.get("monitor/rollbacks", 0.0) for r in steps), default=0.0)),
        "steps": len(steps), "reward_last": steps[-1]["rollout/reward_mean"] if steps else None,
    }  # fmt: skip


def summarize(records: list[dict]) -> dict:
    cells = {}
    for c in CELLS:
        rs = [r for r in records if r["cell"] == c]
        after = mean_se(r["after"] for r in rs)
        cells[c] = {
            "seeds": [r["seed"] for r in rs], "after_mean": after.mean, "after_se": after.se,
            "collapsed": sum(r["collapsed"] for r in rs), "warned": sum(r["first_warning"] is not None for r in rs),
            "rollbacks": sum(r["rollbacks"] for r in rs), "seconds_mean": mean_se(r["seconds"] for r in rs).mean,
        }  # fmt: skip
    by = {c: {r["seed"]: r["after"] for r in records if r["cell"] == c} for c in CELLS}
    gap = paired(by["rollback"], by["log"])
    return {
        "cells": cells,
        "rollback_minus_log": {
            "diff": gap.diff,
            "se": gap.se,
            "text": gap.text(),
            "separated": gap.separated,
        },
    }


def render(data: dict) -> str:
    meta, s = data["meta"], data["summary"]
    lines = [
        f"# The main job's collapse guard, learner.lr {data['lr']:g}",
        "",
        f"`{meta['command']}`; {meta['date']}, commit {meta['commit']}, load {meta['load_before']} before, "
        f"{meta['load_after']} after. Held-out accuracy on 100 tasks; collapsed = after RL below the warm start.",
        "",
    ]
    rows = [
        (c, len(v["seeds"]), f"{v['after_mean']:.2f}" + (f" ± {v['after_se']:.2f}" if v["after_se"] is not None else ""),
         f"{v['collapsed']}/{len(v['seeds'])}", v["warned"], v["rollbacks"], f"{v['seconds_mean']:.0f}")
        for c, v in s["cells"].items() if v["seeds"]
    ]  # fmt: skip
    lines += table(
        [
            "monitor.on_warning",
            "seeds",
            "after RL (mean ± SE)",
            "collapsed",
            "runs warned",
            "rollbacks",
            "s / run",
        ],
        rows,
    )
    gap = s["rollback_minus_log"]
    if gap["diff"] is not None:
        words = {True: "separated", False: "within 2 SE: not separated"}
        said = (
            f" ({words[gap['separated']]})" if gap["separated"] is not None else ""
        )  # text says "no spread"
        lines += [
            "",
            f"rollback − log, paired by seed: {gap['text']}{said}.",
        ]
    if data["missing"]:
        lines += ["", "Not run (time limit): " + ", ".join(data["missing"])]
    lines += [
        "",
        "| run | before | after | first warning | rollbacks | steps | s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['cell']} seed {r['seed']} | {r['before']:.2f} | {r['after']:.2f} | "
        f"{'-' if r['first_warning'] is None else r['first_warning']} | {r['rollbacks']} | {r['steps']} | {r['seconds']} |"
        for r in data["runs"]
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--lr", type=float, default=RECIPE_LR, help=f"learner.lr of every run (the recipe's: {RECIPE_LR:g})"
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    p.add_argument("--time-limit-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--work", type=Path, default=None, help="runs.jsonl and logs (default runs/bench/NAME)")
    results_args(p, NAME)
    args = p.parse_args(argv)
    if args.lr <= 0:
        p.error(f"--lr must be > 0, got {args.lr:g}")
    if args.from_results is not None:
        write(args.from_results.stem, json.loads(args.from_results.read_text()), args.out or RESULTS, render)
        return 0
    name = results_name(args.lr)
    work = args.work or ROOT / "runs" / "bench" / name
    prov = Provenance()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    outcome = Runner(work, args.time_limit_s).run(
        plan(CELLS, args.seeds), lambda job: run_one(job, args.lr, logs)
    )
    data = {
        "meta": prov.meta(), "lr": args.lr, "seeds": args.seeds, "summary": summarize(outcome.records),
        "missing": [j.key for j in outcome.missing], "runs": outcome.records,
    }  # fmt: skip
    write(name, data, args.out or RESULTS, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
