"""Node and replica faults of the reliability campaign, on a Ray cluster of several nodes on one machine.

    .venv/bin/python scripts/reliability.py --only faults --faults node_engine,node_learner,replica_add,replica_remove

Every run: `agent-rl train --address` on a fresh `scripts/cluster.LocalCluster` (head; engines nodes a1, a2
with one CPU each; trainer node b), recipes/tiny_tir_smoke.yaml at k=0 with 2 embedded engine replicas on
the engines nodes, the torch learner on the trainer node, weights by broadcast (gloo), checkpoints every 2
steps. At a random step (and a random moment in it):

- engine node lost: a1 or a2 is killed (its raylet, the replica's actor and server); the pool routes around
  it and the next push forms the weight group without it; the run goes on;
- learner node lost: b is killed; the run stops with one line; a replacement trainer node joins and
  `--resume` finishes the run;
- replica added: an engines node joins and `agent-rl engines add RUN_DIR` starts a replica on it, which
  takes work after the next push;
- replica removed: `agent-rl engines remove RUN_DIR URL --drain-s 2` drains one of the two replicas.

Each run is audited against one uninterrupted run of the same config (batches.jsonl: the prompts of every
step, trajectories lost or trained twice). Recovery time: the fault to the first step logged past the last
one before it (learner node: the restart included); for add/remove, the command's answer time as well.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scripts.cluster import LocalCluster
from scripts.reliability import (
    REFERENCE_DIRS,
    ROOT,
    STEPS,
    FaultResult,
    Run,
    audit,
    batches,
    last_error_line,
    start,
    train_cmd,
    watch,
)

NODES = {"a1": ("engines", 1), "a2": ("engines", 1), "b": ("trainer", 2)}
SETS = {
    "buffer.max_staleness": 0,
    "engines.count": 2,
    "engines.weight_sync": "nccl",
    "engines.max_batch": 8,
    "placement.nodes": "{engines: {count: 3, cpus: 1}, trainer: {cpus: 2}}",
    "placement.engine": "{node: engines, cpus: 1}",
    "placement.learner": "{node: trainer, cpus: 2}",
    "placement.timeout_s": 300,
}
CELLS = ("node_engine", "node_learner", "replica_add", "replica_remove")


def _cmd(model: Path, run_dir: Path, cluster: LocalCluster, resume: bool = False) -> list[str]:
    return train_cmd(model, run_dir, SETS, resume=resume) + ["--address", cluster.address]


def _engines(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "agent_rl.cli", "engines", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    return out, time.monotonic() - t0


def _members(run_dir: Path) -> list[dict]:
    path = run_dir / "engines" / "members.json"
    return json.loads(path.read_text())["members"] if path.exists() else []


def reference(work: Path, model: Path) -> list[dict]:
    """The uninterrupted cluster run (a completed one in `work` from an earlier invocation is reused)."""
    run_dir = work / "cluster_reference"
    if (run_dir / "COMPLETE").exists():
        REFERENCE_DIRS[id(bs := batches(run_dir))] = run_dir
        return bs
    shutil.rmtree(run_dir, ignore_errors=True)
    with LocalCluster(dict(NODES)) as cluster:
        run = start(_cmd(model, run_dir, cluster), work / "cluster_reference.log")
        watch(run, run_dir, timeout_s=1800)
    if run.proc.returncode != 0 or len(batches(run_dir)) != STEPS:
        raise RuntimeError(
            f"the uninterrupted cluster run did not complete: {last_error_line(work / 'cluster_reference.log')}"
        )
    (run_dir / "COMPLETE").write_text("cluster reference\n")
    REFERENCE_DIRS[id(bs := batches(run_dir))] = run_dir
    return bs


def cell(name: str, repeat: int, rng: random.Random, work: Path, model: Path, ref: list[dict]) -> FaultResult:
    """One fault run on a fresh cluster, audited against the uninterrupted run."""
    run_dir, log = work / f"{name}-{repeat}", work / f"{name}-{repeat}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    log.unlink(missing_ok=True)
    at_step = (
        rng.randint(1, 3) if name == "replica_add" else rng.randint(2, STEPS - 4)
    )  # room to start a server
    with LocalCluster(dict(NODES)) as cluster:
        run = start(_cmd(model, run_dir, cluster), log)
        watch(run, run_dir, until=lambda: at_step in run.step_times, timeout_s=1800)
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment within the step
        t_fault, last = time.monotonic(), max(run.step_times, default=-1)
        if run.proc.poll() is not None:
            note, final = "the run ended before the fault", run
        else:
            note, final = FAULTS[name](cluster, run, run_dir, model, log, rng)
        watch(final, run_dir, timeout_s=1800)
    after = [t for s, t in final.step_times.items() if s > last]
    first_rc = run.proc.returncode
    return FaultResult(
        NAMES[name],
        repeat,
        at_step,
        completed=final.proc.returncode == 0 and len(batches(run_dir)) == STEPS,
        exit_code=first_rc,
        user_saw=next(
            (ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("agent-rl:")),
            last_error_line(log),
        )
        if first_rc
        else "",  # fmt: skip
        recovery_s=round(min(after) - t_fault, 2) if after else None,
        audit=audit(run_dir, 2, ref),
        note=note,
    )


Fault = Callable[[LocalCluster, Run, Path, Path, Path, random.Random], tuple[str, Run]]


def engine_node_lost(
    cluster: LocalCluster, run: Run, run_dir: Path, model: Path, log: Path, rng: random.Random
) -> tuple[str, Run]:
    victim = rng.choice(["a1", "a2"])
    cluster.kill(victim)
    return f"engines node {victim} killed (raylet, replica actor and server); routed around", run


def learner_node_lost(
    cluster: LocalCluster, run: Run, run_dir: Path, model: Path, log: Path, _: random.Random
) -> tuple[str, Run]:
    cluster.kill("b")
    t0 = time.monotonic()
    run.proc.wait(timeout=1800)
    stopped = time.monotonic() - t0
    cluster.add("b2", "trainer", 2)  # the replacement node
    resumed = start(_cmd(model, run_dir, cluster, resume=True), log)
    resumed.step_times = {s: 0.0 for s in run.step_times}  # steps redone after the resume do not count
    return (
        f"trainer node b killed: the run stopped in {stopped:.1f} s (exit {run.proc.returncode}); node b2 joined; --resume",
        resumed,
    )


def replica_added(cluster: LocalCluster, run: Run, run_dir: Path, *_: object) -> tuple[str, Run]:
    cluster.add("a3", "engines", 1)
    out, took = _engines("add", str(run_dir))
    if out.returncode != 0:
        return f"engines add failed: {out.stdout.strip()} {out.stderr.strip()[-200:]}", run
    url = out.stdout.split()[1]
    t0 = time.monotonic()
    while run.proc.poll() is None and not any(m["name"] == url and m["served"] for m in _members(run_dir)):
        time.sleep(0.2)
    served = time.monotonic() - t0
    return (
        f"node a3 joined; `engines add` answered in {took:.1f} s; the replica served after {served:.1f} s more",
        run,
    )


def replica_removed(cluster: LocalCluster, run: Run, run_dir: Path, *_: object) -> tuple[str, Run]:
    url = _members(run_dir)[0]["name"]
    out, took = _engines("remove", str(run_dir), url, "--drain-s", "2")
    return (
        f"`engines remove --drain-s 2` answered in {took:.1f} s: {(out.stdout or out.stderr).strip()[-160:]}",
        run,
    )


FAULTS: dict[str, Fault] = {
    "node_engine": engine_node_lost,
    "node_learner": learner_node_lost,
    "replica_add": replica_added,
    "replica_remove": replica_removed,
}
NAMES = {"node_engine": "engine node lost", "node_learner": "learner node lost + --resume",
         "replica_add": "engine replica added mid-run", "replica_remove": "engine replica removed mid-run"}  # fmt: skip


def cluster_faults(
    add: Callable[[FaultResult], None],
    work: Path,
    model: Path,
    rng: random.Random,
    repeats: int,
    wanted: set[str],
) -> None:
    """The cells in `wanted`, `repeats` times each, after one uninterrupted reference run."""
    cells = [c for c in CELLS if c in wanted]
    if not cells:
        return
    print("cluster faults: uninterrupted reference run", flush=True)
    ref = reference(work, model)
    for repeat in range(repeats):
        for name in cells:
            print(f"cluster fault: {NAMES[name]} #{repeat}", flush=True)
            add(cell(name, repeat, rng, work, model, ref))
