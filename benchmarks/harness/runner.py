"""Run a benchmark's cells x seeds: interleaved and rotated, resumable by cell, inside a time limit that drains.

- **Order** (`plan`): seed by seed, every cell once per seed, the cells' order rotated by one each seed
  (seed 0: A B C, seed 1: B C A, seed 2: C A B), so no cell always runs first (cold caches) or last (a machine
  whose load grows), and a run cut short has every cell at about the same number of seeds.
- **Resume** (`Runner`): each finished (cell, seed) is one line of `runs.jsonl` in the work folder, appended
  when it finishes; a new invocation skips the ones there. A line is written whole or not at all, so a kill
  leaves no half-run cell behind (a line cut by a kill is ignored on reading).
- **Time limit that drains**: past `time_limit_s`, no new (cell, seed) starts; the one running finishes and is
  recorded. The runs left are returned, so the results file says what is missing.
- **Tuning pass** (`tune`): candidates of each system run a few steps, interleaved the same way, in the same
  invocation; the fastest of each system (lowest `key`) is chosen. The measurements and the choice go into the
  results file.

Why not Ray Tune (Ray is a dependency already): Tune schedules trials by its own searcher and resources, not in
a fixed interleaved, rotated order; its trials are actors in a Ray cluster whose own processes load the 2-core
machine the timings are taken on; its resume restores experiment state from its own folders rather than from
one plain file of finished runs that a report can be regenerated from; and the grids here are a few dozen
cells, not a search space. A loop of ~100 lines does the job and keeps every run's record in the results.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    """One run: a cell (its name) at one seed."""

    cell: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.cell}@{self.seed}"


def plan(cells: Sequence[str], seeds: Sequence[int], rotate: bool = True) -> list[Job]:
    """Seed-major order, the cells rotated by one per seed (see the module docstring)."""
    out = []
    for i, seed in enumerate(seeds):
        shift = i % len(cells) if rotate and cells else 0
        out += [Job(c, seed) for c in [*cells[shift:], *cells[:shift]]]
    return out


def read_runs(path: Path) -> dict[str, dict]:
    """Job key -> record of every whole line of a runs.jsonl (a line cut by a kill is skipped)."""
    out: dict[str, dict] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[Job(rec["cell"], rec["seed"]).key] = rec
    return out


@dataclass
class Outcome:
    records: list[dict]  # every finished run of the plan (earlier invocations' too), in plan order
    missing: list[Job]  # the plan's runs not run (time limit)

    def complete_seeds(self, cells: Sequence[str], seeds: Sequence[int]) -> list[int]:
        """The seeds whose every cell has run (a report compares cells seed by seed)."""
        missing = {j.key for j in self.missing}
        return [s for s in seeds if all(Job(c, s).key not in missing for c in cells)]


class TimeLimit:
    """A time limit that drains, from its making: `passed()` once `limit_s` have gone by (never when None); a loop
    asks it before starting a run, so the run started last finishes."""

    def __init__(self, limit_s: float | None, clock: Callable[[], float] = time.monotonic):
        self.limit, self.clock, self.start = limit_s, clock, clock()

    def passed(self) -> bool:
        return self.limit is not None and self.clock() - self.start >= self.limit


class Runner:
    """`Runner(work, time_limit_s).run(jobs, fn)`: fn(job) -> dict (the run's record, JSON-able) for each job not
    already in work/runs.jsonl; stops starting jobs once the limit has passed."""

    def __init__(
        self, work: Path, time_limit_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.work, self.limit, self.clock = Path(work), time_limit_s, clock
        self.path = self.work / "runs.jsonl"

    def run(
        self, jobs: Sequence[Job], fn: Callable[[Job], dict], log: Callable[[str], None] = print
    ) -> Outcome:
        self.work.mkdir(parents=True, exist_ok=True)
        done = read_runs(self.path)
        limit = TimeLimit(self.limit, self.clock)
        for i, job in enumerate(jobs):
            if job.key in done:
                continue
            if limit.passed():
                left = [j for j in jobs[i:] if j.key not in done]
                log(f"time limit {self.limit:.0f} s reached: {len(left)} runs left for the next invocation")
                break
            log(f"[{i + 1}/{len(jobs)}] {job.key}")
            rec = {"cell": job.cell, "seed": job.seed, **fn(job)}
            with self.path.open("a") as f:  # one write of one line: whole or not at all
                f.write(json.dumps(rec) + "\n")
            done[job.key] = rec
        return Outcome([done[j.key] for j in jobs if j.key in done], [j for j in jobs if j.key not in done])


def interleave(candidates: Mapping[str, Sequence[T]]) -> list[tuple[str, T]]:
    """One candidate of each system in turn (A1 B1 A2 B2 B3 ...), so a burst of load hits no system alone."""
    queues = {name: list(cands) for name, cands in candidates.items()}
    out = []
    while any(queues.values()):
        for name, q in queues.items():
            if q:
                out.append((name, q.pop(0)))
    return out


def tune(
    candidates: Mapping[str, Sequence[T]],
    measure: Callable[[str, T], float | None],
    label: Callable[[T], str] = str,
) -> dict:
    """Each system's candidates measured once, in `interleave` order; per system the candidate with the lowest
    value is chosen (one that failed measures None and is never chosen; a system whose every candidate failed
    is chosen None). Returns {'measured': {'SYSTEM: LABEL': value}, 'chosen': {system: candidate or None}}."""
    measured: dict[str, float | None] = {}
    for system, cand in interleave(candidates):
        measured[f"{system}: {label(cand)}"] = measure(system, cand)
    return {"measured": measured, "chosen": choose(candidates, measured, label)}


def choose(
    candidates: Mapping[str, Sequence[T]],
    measured: Mapping[str, float | None],
    label: Callable[[T], str] = str,
) -> dict[str, T | None]:
    """Per system, the candidate with the lowest measured value ('SYSTEM: LABEL' keys; None or absent: did not
    run), None where none ran."""
    out: dict[str, T | None] = {}
    for system, cands in candidates.items():
        ran = [c for c in cands if measured.get(f"{system}: {label(c)}") is not None]
        out[system] = min(ran, key=lambda c, s=system: measured[f"{s}: {label(c)}"]) if ran else None
    return out
