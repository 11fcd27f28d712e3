"""`agent-rl train` runs as the benchmarks make them: one process per run, as a user runs it, its output in a log
beside the run directory; the trained steps' metrics records it leaves; and the random tiny model a `--quick`
machinery check trains from."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness.provenance import ROOT


def train_command(recipe: Path, sets: list[str]) -> list[str]:
    """`python -m agent_rl.cli train RECIPE --set k=v ...` with this interpreter."""
    return [sys.executable, "-m", "agent_rl.cli", "train", str(recipe), *(a for s in sets for a in ("--set", s))]  # fmt: skip


def run_logged(cmd: list[str], log: Path, name: str, env: dict | None = None) -> float:
    """`cmd` run in the checkout to its end, its output in `log`; its wall seconds. A failure stops the benchmark with
    one line naming the run (`name`) and its log."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        raise SystemExit(f"{name} failed (exit {rc}); log {log}")
    return time.monotonic() - t0


def train(
    recipe: Path,
    sets: list[str],
    run_dir: Path,
    env: dict | None = None,
    name: str | None = None,
    cores: str | None = None,
) -> float:
    """One run into `run_dir` (emptied first; `logging.run_dir` set to it), its output in RUN_DIR.log beside it;
    returns its wall seconds. `cores` ("0,1"): pinned there with taskset, its children too. A failed run stops the
    benchmark with one line naming the run (`name`) and its log."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = train_command(recipe, [*sets, f"logging.run_dir={run_dir}"])
    cmd = cmd if cores is None else ["taskset", "-c", cores, *cmd]
    return run_logged(cmd, run_dir.parent / f"{run_dir.name}.log", name or run_dir.name, env)


def step_records(run_dir: Path) -> list[dict]:
    """The run's metrics records of its trained steps (those with `perf/step_seconds`), in step order."""
    from agent_rl.metrics import read_metrics

    return [r for r in read_metrics(run_dir) if "perf/step_seconds" in r]


def tiny_model(work: Path) -> Path:
    """WORK/tiny: a random one-layer model on tiny_arith's tokenizer (built once), the warm start of a `--quick`
    machinery check that would otherwise need one trained first: it checks the machinery, its numbers mean nothing."""
    model = work / "tiny"
    if not (model / "config.json").is_file():
        from agent_rl.tools.tiny import build_tiny
        from envs.tiny_arith import corpus

        build_tiny(model, corpus(), vocab_size=512, seed=0, hidden=64, layers=1, heads=2, kv_heads=1)
    return model
