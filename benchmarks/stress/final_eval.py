"""Held-out accuracy of each stress run's *learner* policy at its last step (its final checkpoint).

    .venv/bin/python -m benchmarks.stress.final_eval runs [--jobs 2] [--glob 'stress_*']   # -> runs/<name>/final_eval.json

Why: under `rollout.fixed_lag=k` the engines hold the weights of k versions ago, and the periodic eval runs
on the engines, so the run's `eval/accuracy` at step t is the policy the learner had k steps earlier. The
final checkpoint holds the learner's own weights; this evaluates it with the run's recipe and seed
(`agent-rl eval`). Runs that already have final_eval.json, or have no checkpoint, are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def read(run: Path) -> float | None:
    """The accuracy `evaluate` wrote for this run dir (None if it has not run); one that is not a finite number is
    named with what to do."""
    path = run / "final_eval.json"
    if not path.is_file():
        return None
    acc = json.loads(path.read_text())["accuracy"]
    if not isinstance(acc, (int, float)) or not math.isfinite(acc):
        raise ValueError(f"{path}: field accuracy is {acc}; delete the file to re-evaluate the run")
    return acc


def write(run: Path, accuracy: float, tasks: int, seed: int) -> None:
    """RUN/final_eval.json, whole or not at all (written beside, then renamed): a study's report reads run dirs
    while other runs are being scored."""
    tmp = run / "final_eval.json.tmp"
    tmp.write_text(json.dumps({"accuracy": accuracy, "tasks": tasks, "seed": seed}))
    os.replace(tmp, run / "final_eval.json")


def evaluate(run: Path) -> str:
    out = run / "final_eval.json"
    if out.is_file() or not (run / "checkpoints" / "latest").exists():
        return f"skip {run.name}"
    seed = json.loads((run / "resolved_config.json").read_text())["train"]["seed"]
    proc = subprocess.run(
        [sys.executable, "-m", "agent_rl.cli", "eval", str(run / "config.yaml"), "--checkpoint", str(run),
         "--set", f"train.seed={seed}"],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    if proc.returncode:
        return f"FAILED {run.name}: {proc.stderr.strip().splitlines()[-1:]}"
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    write(run, report["accuracy"], report["tasks"], seed)
    return f"{run.name}: {report['accuracy']:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--glob", default="stress_*", help="which run dirs (default stress_*)")
    args = ap.parse_args()
    runs = sorted(p.parent for p in Path(args.runs_dir).glob(f"{args.glob}/metrics.jsonl"))
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, line in enumerate(pool.map(evaluate, runs), 1):
            print(f"[{i}/{len(runs)}] {line}", flush=True)


if __name__ == "__main__":
    main()
