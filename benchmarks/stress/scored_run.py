"""One planned run of an lr-matched study (`k_sweep`, `level_b_fair`): trained by `agent-rl train` in its own process
(benchmarks/harness/pool.py), scored by its final checkpoint's held-out accuracy (`final_eval`), its checkpoints
then dropped. A run counts once final_eval.json exists; one trained but not scored is scored, not trained again."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import pool
from benchmarks.harness.report import results_file
from benchmarks.stress import final_eval

WARM_RECORD = "warm_start.json"  # in a finished run dir: the warm start it started from


@dataclass(frozen=True)
class Planned:
    """One run to do: its name, part, method (the one whose run it is: at k = 0 a twin's), lag, seed and the
    recipe overrides (lr and method)."""

    name: str
    part: str
    method: str
    k: int
    seed: int
    sets: tuple[str, ...]

    @property
    def curve(self) -> bool:
        """Whether the run evaluates periodically: the selection reads only finals, so it saves those evals."""
        return self.part != "select"


@dataclass(frozen=True)
class Runner:
    """How a study trains and scores one planned run (nice level, paths, budgets). `warm_start`: what each finished
    run records of the warm start it started from (WARM_RECORD; an object with `to_json()`), or None."""

    runs: Path
    warm_start: object | None
    recipe: str
    warm: str
    steps: int
    eval_every: int
    nice: int = 15  # the machine is shared: runs yield to interactive work

    def train_cmd(self, p: Planned) -> list[str]:
        sets = [f"model.path={self.warm}", f"rollout.fixed_lag={p.k}", f"train.seed={p.seed}",
                f"train.steps={self.steps}", f"name={p.name}", f"logging.run_dir={self.runs / p.name}",
                "logging.tensorboard=false", "checkpoint.every=0", "monitor.on_warning=log", f"eval.every={self.eval_every if p.curve else 0}", *p.sets]  # fmt: skip
        cmd = ["nice", "-n", str(self.nice), sys.executable, "-m", "agent_rl.cli", "train", self.recipe]
        return cmd + [x for s in sets for x in ("--set", s)]

    def trained(self, run: Path) -> bool:
        metrics = run / "metrics.jsonl"
        if not metrics.is_file() or not (run / "checkpoints" / "latest").exists():
            return False
        steps = {json.loads(line).get("step") for line in metrics.read_text().splitlines() if line.strip()}
        return self.steps - 1 in steps

    def progress(self, p: Planned) -> Path:
        return self.runs / f"{p.name}.log"

    def __call__(self, p: Planned) -> str:
        """Train (unless a finished training is there), score the final checkpoint, drop the checkpoints."""
        run = self.runs / p.name
        if final_eval.read(run) is not None:
            return f"{p.name}: done already"
        if not self.trained(run):
            shutil.rmtree(run, ignore_errors=True)
            self.runs.mkdir(parents=True, exist_ok=True)
            with open(self.progress(p), "w") as log:
                returncode = pool.start(self.train_cmd(p), log)
            if returncode:
                return f"FAILED {p.name} (exit {returncode}; {self.progress(p)})"
        if (
            self.warm_start is not None and not (run / WARM_RECORD).is_file()
        ):  # the study checked it is the kept one
            (run / WARM_RECORD).write_text(json.dumps(self.warm_start.to_json()))
        msg = final_eval.evaluate(run)
        if final_eval.read(run) is not None:
            shutil.rmtree(run / "checkpoints", ignore_errors=True)
        return msg


def study_args(parser: argparse.ArgumentParser, out: Path | str, warm: str) -> None:
    """The options of a study of scored runs: --runs, --out, --from-results, --warm, and the pool's --jobs and
    --stop-starting-after."""
    parser.add_argument("--runs", default="runs", type=Path, help="the run dirs (default: runs)")
    parser.add_argument(
        "--out", default=Path(out), type=Path, help="the results file (its .md and .png beside)"
    )
    parser.add_argument("--from-results", type=results_file, default=None,
                        help="report: from this results file's kept runs alone (no run dir read), into --out")  # fmt: skip
    parser.add_argument(
        "--warm", default=warm, help="run: the warm start the runs start from (default: %(default)s)"
    )
    pool.pool_args(parser)


def sources(args: argparse.Namespace) -> tuple[Path, Path]:
    """(the results file whose kept runs count, the run dirs' folder): --out's and --runs, or with --from-results that
    file and no run dir."""
    return (args.out, args.runs) if args.from_results is None else (args.from_results, Path(os.devnull))
