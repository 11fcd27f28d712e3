"""Runs in their own processes, N at a time, re-planned as each finishes, drained and stopped by signal: the runner
of the studies whose next runs depend on the last ones (an lr selection decides which held-out runs come next), where
`runner.Runner` runs a fixed plan one (cell, seed) at a time.

- `start(cmd, log)`: one run's process (`agent-rl train`), listed so that a stop reaches it.
- `on_signals(name)`: SIGTERM stops the runs training now (Ctrl-C's SIGINT, SIGKILL after STOP_WAIT_S) and exits;
  SIGUSR1 drains: no run starts from then on, the ones training finish and are scored.
- `pool_args(parser)`, `stop_time(args, name)`: `--jobs`, `--stop-starting-after` and its check.
- `drain(plan, run, jobs, ...)`: every run `plan()` names, `jobs` at a time, `plan` asked again after each finishes;
  past `stop_starting_at` (time.monotonic()) or after SIGUSR1 none starts. A run stopped half-way trains again
  from its start, so a machine lent for a known time is drained, not killed.

Resume is the caller's: `plan()` leaves out the runs whose results are in (their folders, or the results file).
Hand-written (not a process pool library) because the stop must reach the runs' own processes, which a pool's
workers do not own, and a drain must keep the runs training, which a pool's shutdown does not wait for by run.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import IO, Protocol, TypeVar

STOP_WAIT_S = 60  # a stopped sweep waits this long for a run's Ctrl-C unwinding, then SIGKILLs it

# the runs training now, and whether the sweep is stopping: both under the lock, so that no run starts, or is
# started but not yet listed, when the sweep stops them (on_signals)
_TRAINING: set[subprocess.Popen] = set()
_STOPPING = threading.Event()
_TRAINING_LOCK = threading.Lock()
DRAINING = threading.Event()  # set by SIGUSR1 or by `drain` past its stop time: start no new run


class Planned(Protocol):
    name: str
    part: str


P = TypeVar("P", bound=Planned)


def start(cmd: list[str], log: IO) -> int:
    """Run `cmd` (OMP_NUM_THREADS=1, output to `log`) to its end, listed while it runs; its exit status (-SIGTERM
    without starting once the sweep is stopping)."""
    with _TRAINING_LOCK:
        if _STOPPING.is_set():
            return -signal.SIGTERM
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        _TRAINING.add(proc)
    try:
        return proc.wait()
    finally:
        with _TRAINING_LOCK:
            _TRAINING.discard(proc)


def on_signals(name: str) -> None:
    """SIGUSR1: start no new run (`drain`). SIGTERM (`kill`): stop the runs training now and exit once they are gone:
    left running, a run would go on writing the run dir that the next invocation clears to train it again. They get
    Ctrl-C's SIGINT (which reaches them from a terminal already: they share its process group), not SIGTERM:
    `agent-rl train` would finish its step and checkpoint it, and the sweep trains an unfinished run again from its
    start."""

    def stop(signum: int, _frame) -> None:
        with _TRAINING_LOCK:
            _STOPPING.set()
            training = list(_TRAINING)
        for proc in training:
            proc.send_signal(signal.SIGINT)
        for proc in training:
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                print(
                    f"{name}: pid {proc.pid} did not stop on SIGINT in {STOP_WAIT_S} s: SIGKILL", flush=True
                )
                proc.kill()
        raise SystemExit(
            f"{name}: stopped by signal {signum}; its unfinished runs start again with the next `run`"
        )

    def drain_now(_signum: int, _frame) -> None:
        DRAINING.set()  # stderr: the main thread may be printing to stdout when this runs
        print(f"{name}: SIGUSR1: starting no new run; exiting once the runs training finish", file=sys.stderr,
              flush=True)  # fmt: skip

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, drain_now)
    # A sweep started in the background (`nohup ... &` from a script) inherits SIGINT ignored, and so would its
    # runs (an ignored signal stays ignored across exec): caught here, it is default again in each run.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def drain(
    plan: Callable[[], Sequence[P]],
    run: Callable[[P], str],
    jobs: int,
    name: str,
    progress: Callable[[P], object],
    stop_starting_at: float | None = None,
    every_jobs: Callable[[], None] = lambda: None,
) -> bool:
    """Every run `plan()` names, `jobs` at a time; `plan()` is asked again after each finishes (a run started is
    never started twice). `run(p)` trains and scores one and returns its line; `progress(p)` says where its progress
    is; `every_jobs()` after every `jobs` finished (a report rewritten as runs come in). Returns whether it drained
    (SIGUSR1 or `stop_starting_at` passed) rather than ran out of runs."""
    started: set[str] = set()
    done, t0 = 0, time.time()
    with ThreadPoolExecutor(jobs) as pool:
        running: dict[Future, P] = {}
        while True:
            todo = [p for p in plan() if p.name not in started]
            if (
                stop_starting_at is not None
                and time.monotonic() >= stop_starting_at
                and not DRAINING.is_set()
            ):
                DRAINING.set()
                print(
                    f"{name}: --stop-starting-after: starting no new run; {len(running)} training", flush=True
                )
            while todo and len(running) < jobs and not DRAINING.is_set():
                p = todo.pop(0)
                started.add(p.name)
                running[pool.submit(run, p)] = p
                print(f"start {p.name} ({p.part}; its progress: {progress(p)})", flush=True)
            if not running:
                return DRAINING.is_set()
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                p = running.pop(f)
                done += 1
                left = len(todo) + len(running)
                eta = (time.time() - t0) / done * left  # completions so far already run `jobs` at a time
                print(
                    f"[{done} done, {left} to go, part {p.part}, ETA {eta / 3600:.1f} h] {f.result()}",
                    flush=True,
                )
                if done % jobs == 0:
                    every_jobs()


def pool_args(parser: argparse.ArgumentParser) -> None:
    """The options of a study run on the pool: `--jobs N` and `--stop-starting-after MIN`."""
    parser.add_argument(
        "--jobs", type=int, default=1, help="run: runs at a time (one core each; 1 on a shared machine)"
    )
    parser.add_argument("--stop-starting-after", type=float, metavar="MIN",
                        help="run: start no run once MIN minutes have passed, finish those training, exit (SIGUSR1: at once)")  # fmt: skip


def stop_time(args: argparse.Namespace, name: str) -> float | None:
    """`--stop-starting-after` as the time.monotonic() past which `drain` starts no run (None: no limit); a bad value
    stops with one line naming it."""
    after = args.stop_starting_after
    if after is not None and not (math.isfinite(after) and after >= 0):
        raise SystemExit(f"{name}: --stop-starting-after {after:g}: give the minutes, 0 or more")
    return None if after is None else time.monotonic() + after * 60
