"""Level (b), the k-sweep: every method at its own best lr, accuracy and collapse rate against staleness up to k=64.

    nice -n 15 .venv/bin/python -m benchmarks.stress.k_sweep run        # everything still missing, resumable
    nice -n 15 .venv/bin/python -m benchmarks.stress.k_sweep run --stop-starting-after 150  # then drain and exit
    .venv/bin/python -m benchmarks.stress.k_sweep plan [PART]           # the runs still to go, in order
    .venv/bin/python -m benchmarks.stress.k_sweep report                # -> benchmarks/results/stress/k_sweep2.{json,md,png}
    .venv/bin/python -m benchmarks.stress.k_sweep report --from-results F --out F  # F rewritten from its kept runs

The next level of the lr-matched study (`level_b_fair`, issue 28) on a task the toy does not saturate (issue 38):
envs/tiny_multistep.yaml (2-3 tool calls per problem; warm start `benchmarks.stress.multistep_warm`), the full
stack, batch b sampled by policy version max(0, b-k) (`rollout.fixed_lag`: exactly k stale from step k on; the
first k batches all come from the warm start, 64 of the 80 at k=64). Parts, in the order `run` does them:

- calibrate: sync (k=0) VCPO and plain REINFORCE, seed 0 (not a selection or held-out seed), with the held-out
  curve: does sync RL climb well above the warm start, and for how long (with the k=0 held-out runs, which
  have the same curves, the results' calibration table);
- select: every method at every lr of LRS on seeds SELECT_SEEDS at k = SELECT_LAG; each method's lr is the one
  with the highest mean final there (held-out seeds never read); where that is the grid's lowest or highest lr,
  the method's grid grows past it (`select`) until its best lies inside;
- heldout: each method at its chosen lr on seeds HELDOUT_SEEDS at every k of LAGS, lowest k first.

VCPO is selected like every other method (no recipe lr). At k = 0 every IS weight is 1 and ESS/B = 1, so tis, mis,
m2po and the ESS lr alone make plain's update and OPOB alone makes VCPO's: those cells are plain's and VCPO's
runs at the method's own lr (`level_b_fair.SAME_AS_AT_K0`). Every calibration and held-out run evaluates every
EVAL_EVERY steps (under a fixed lag that is the policy k versions back, logged as eval/policy_version), and every
run once more from its final checkpoint (the learner's own policy, `final_eval`): the final is the result, the
curve gives the area under it. Selection runs skip the periodic evals: the choice reads finals only.

Resumable: a run counts once final_eval.json exists; its numbers are kept in k_sweep.json, so the run dirs can go
and a later session finishes the sweep with the same command. A run stopped half-way trains again from its start,
so a sweep on a machine lent for a known time is drained, not killed: SIGUSR1 (or --stop-starting-after MIN)
starts no new run and exits once the ones training are scored.

One sweep, one warm start: every run records the warm start it started from (its held-out accuracy and the sha256
of its weights, `WarmStart`), and `run` refuses to add runs from any other warm start to a file whose kept runs
started from one. SFT on another CPU rounds differently, and this small model carries that far: rebuilt on an AVX2
EPYC the warm start scored 0.12 held out, where the first sweep's (built on another machine) scored 0.08. So the
sweep runs from a kept copy, WARM, which the repository holds (`multistep_warm` says how it was made).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import pool
from benchmarks.stress import final_eval, scored_run
from benchmarks.stress.level_b_fair import OVERRIDES, SAME_AS_AT_K0

RECIPE = "recipes/tiny_multistep.yaml"
WARM = "benchmarks/results/stress/k_sweep_warm/sft"  # kept: the sweep's runs start from these weights
OUT = "benchmarks/results/stress/k_sweep2.json"  # the sweep from WARM (k_sweep.json: the first, its warm start lost)
METHODS = ("plain", "tis", "mis", "m2po", "ess_lr", "opob", "vcpo")
LRS = (1e-4, 2e-4, 4e-4, 8e-4)
LR_BOUNDS = (2.5e-5, 3.2e-3)  # how far the grid grows past an edge its best sits on (`select`)
LAGS = (0, 4, 8, 16, 32, 64)
SELECT_LAG = 8
SELECT_SEEDS = (0, 1, 2)
HELDOUT_SEEDS = (3, 4, 5, 6, 7)
CALIBRATE = (("vcpo", 2e-4, 0), ("plain", 2e-4, 0))  # (method, lr, seed) at k = 0: a first look at sync RL
STEPS = 80
EVAL_EVERY = 10
PREFIX = "ksweep"
NAME = re.compile(rf"{PREFIX}_(\w+?)_lr([0-9.e-]+)_k(\d+)_s(\d+)$")
PARTS = ("calibrate", "select", "heldout")
STOP_WAIT_S = pool.STOP_WAIT_S
WARM_RECORD, Planned = scored_run.WARM_RECORD, scored_run.Planned


@dataclass(frozen=True)
class Cell:
    """One finished run: what it ran, the learner's final held-out accuracy, the held-out curve against the
    policy version it measured, and the ESS ratio (ESS/B) of every trained step."""

    method: str
    lr: float
    k: int
    seed: int
    final_accuracy: float
    curve: tuple[tuple[int, float], ...]  # (policy version, held-out accuracy), version 0 = the warm start
    ess: tuple[float, ...]
    steps: int
    warm: float  # held-out accuracy of the warm start the run started from (its warm_eval.json)
    warm_sha256: str | None = None  # of its weights; None: recorded before runs kept it (2026-11-28)

    @property
    def warm_start(self) -> WarmStart:
        return WarmStart(self.warm, self.warm_sha256)

    @property
    def collapsed(self) -> bool:
        """Ended below where it started."""
        return self.final_accuracy < self.warm

    @property
    def auc(self) -> float:
        """Area under the held-out accuracy curve over policy versions 0..steps, divided by steps (the mean
        accuracy of the run's policies; trapezoids between the measured versions)."""
        pts = sorted(dict(self.curve).items())
        area = sum((v1 - v0) * (a0 + a1) / 2 for (v0, a0), (v1, a1) in zip(pts, pts[1:], strict=False))
        span = pts[-1][0] - pts[0][0]
        return area / span if span else pts[0][1]

    @property
    def ess_mean(self) -> float | None:
        return statistics.mean(self.ess) if self.ess else None

    def row(self) -> dict:
        return asdict(self) | {"collapsed": self.collapsed, "auc": self.auc, "ess_mean": self.ess_mean}

    @classmethod
    def from_row(cls, r: dict) -> Cell:
        return cls(r["method"], float(r["lr"]), int(r["k"]), int(r["seed"]), float(r["final_accuracy"]),
                   tuple((int(v), float(a)) for v, a in r["curve"]), tuple(float(e) for e in r["ess"]),
                   int(r["steps"]), float(r["warm"]), r.get("warm_sha256"))  # fmt: skip


@dataclass(frozen=True)
class WarmStart:
    """The warm start runs start from: its held-out accuracy and the sha256 of its weight files (None for runs
    recorded before runs kept it: then only the accuracy tells two apart)."""

    accuracy: float
    sha256: str | None

    def same_as(self, other: WarmStart) -> bool:
        if self.accuracy != other.accuracy:
            return False
        return self.sha256 is None or other.sha256 is None or self.sha256 == other.sha256

    def __str__(self) -> str:
        sha = f"weights sha256 {self.sha256[:12]}" if self.sha256 else "weights not fingerprinted"
        return f"held-out {self.accuracy:.2f}, {sha}"

    def to_json(self) -> dict:
        return {"accuracy": self.accuracy, "sha256": self.sha256}


def run_name(method: str, lr: float, k: int, seed: int) -> str:
    return f"{PREFIX}_{method}_lr{lr:g}_k{k}_s{seed}"


def warm_start_accuracy(warm: str | Path) -> float | None:
    """The held-out accuracy of the warm start at WARM (multistep_warm writes it beside, in warm_eval.json), or
    None while it is not built."""
    path = Path(warm).parent / "warm_eval.json"
    if not path.is_file():
        return None
    acc = json.loads(path.read_text()).get("accuracy")
    if not isinstance(acc, (int, float)) or not math.isfinite(acc):
        raise ValueError(
            f"{path}: field accuracy is {acc!r}; delete the file to evaluate the warm start again"
        )
    return float(acc)


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 of a model dir's *.safetensors, their bytes in name order (one file: what `sha256sum` prints)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{model_dir}: no *.safetensors in it: not a finished warm start; delete it to rebuild"
        )
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def load_warm_start(warm: str | Path) -> WarmStart | None:
    """The warm start at WARM (accuracy and fingerprint), or None while it is not built."""
    acc = warm_start_accuracy(warm) if Path(warm).is_dir() else None
    return None if acc is None else WarmStart(acc, weights_sha256(warm))


def check_same_warm_start(cells: dict[tuple, Cell], warm: WarmStart, where: str, out: Path) -> None:
    """Refuse, in one line that says what to do, to add runs from WARM to a file whose kept runs started from
    another warm start."""
    other = [c for c in cells.values() if not c.warm_start.same_as(warm)]
    if other:
        raise SystemExit(
            f"k_sweep: the warm start at {where} ({warm}) is not the one {len(other)} runs kept in {out} started "
            f"from ({other[0].warm_start}): one sweep, one warm start. Name that warm start with --warm, or give "
            "this one its own sweep with --out NEW.json --runs NEW_DIR"
        )


def read_run(run: Path, warm_start: WarmStart | None) -> Cell | None:
    """The cell of a finished run dir (final_eval.json written), else None. The run's warm start is the one it
    recorded (WARM_RECORD), else (a run dir from before runs recorded it) `warm_start`."""
    m = NAME.match(run.name)
    final = final_eval.read(run)
    if m is None or final is None:
        return None
    method, lr, k, seed = m.group(1), float(m.group(2)), int(m.group(3)), int(m.group(4))
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [r for r in recs if "vcpo/ess_ratio" in r]
    steps = max((int(r["step"]) for r in recs), default=-1) + 1
    curve: dict[int, float] = {}
    for r in recs:
        if "eval/accuracy" in r:
            # the engines' policy: version eval/policy_version (older runs: step + 1 - k, the lagged copy)
            version = int(r.get("eval/policy_version", max(0, int(r["step"]) + 1 - k)))
            curve[version] = float(r["eval/accuracy"])
    if (run / WARM_RECORD).is_file():
        rec = json.loads((run / WARM_RECORD).read_text())
        warm_start = WarmStart(float(rec["accuracy"]), rec["sha256"])
    if warm_start is None:
        raise ValueError(f"{run}: finished, but it recorded no {WARM_RECORD} and no warm start was given")
    curve[0] = warm_start.accuracy
    curve[steps] = final  # the learner's own policy after the last step
    return Cell(method, lr, k, seed, final, tuple(sorted(curve.items())),
                tuple(float(r["vcpo/ess_ratio"]) for r in trained), steps, warm_start.accuracy,
                warm_start.sha256)  # fmt: skip


def read_cells(
    runs_dir: Path, earlier: Path | None = None, warm_start: WarmStart | None = None
) -> dict[tuple, Cell]:
    """Every finished run under runs_dir plus the cells an earlier report kept; a run dir wins over its kept
    copy. Keyed by (method, lr, k, seed). warm_start: for a run dir that did not record its own (default: WARM's;
    a finished run with neither is an error)."""
    cells: dict[tuple, Cell] = {}
    if earlier is not None and earlier.is_file():
        for r in json.loads(earlier.read_text())["cells"]:
            c = Cell.from_row(r)
            cells[(c.method, c.lr, c.k, c.seed)] = c
    for path in sorted(runs_dir.glob(f"{PREFIX}_*/final_eval.json")):
        recorded = (path.parent / WARM_RECORD).is_file()
        if not recorded and warm_start is None and (warm_start := load_warm_start(WARM)) is None:
            raise ValueError(
                f"{path.parent}: finished, but {Path(WARM).parent / 'warm_eval.json'} is missing"
            )
        cell = read_run(path.parent, warm_start)
        if cell is not None:
            cells[(cell.method, cell.lr, cell.k, cell.seed)] = cell
    return cells


def twin(method: str, k: int) -> str:
    """The method whose runs a cell is: at k = 0 the corrected methods make plain's or VCPO's update."""
    return SAME_AS_AT_K0.get(method, method) if k == 0 else method


def finals(cells: dict[tuple, Cell], method: str, lr: float, k: int, seeds: tuple[int, ...]) -> list[Cell]:
    """The finished runs of (method, lr, k) over these seeds (k = 0 of a same-as method: its twin's)."""
    m = twin(method, k)
    return [cells[key] for s in seeds if (key := (m, lr, k, s)) in cells]


@dataclass(frozen=True)
class Selection:
    """A method's lr selection: its grid (LRS, grown past an edge); `ran`, the lrs of the grid with every
    selection seed finished; `chosen`, the best of those (None until all of LRS ran); `done`, whether the whole
    grid ran and grows no further (its held-out runs can start)."""

    grid: tuple[float, ...]
    ran: tuple[float, ...]
    chosen: float | None
    done: bool


def _mean_final(cells: dict[tuple, Cell], method: str, lr: float) -> float | None:
    runs = finals(cells, method, lr, SELECT_LAG, SELECT_SEEDS)
    return statistics.mean(c.final_accuracy for c in runs) if len(runs) == len(SELECT_SEEDS) else None


def select(cells: dict[tuple, Cell], method: str) -> Selection:
    """The method's lr: the highest mean final at k = SELECT_LAG over the selection seeds (ties: the lower lr),
    held-out seeds never read. Where the best sits on an edge of the grid, the grid grows past it by one lr (half
    the lowest, twice the highest; within LR_BOUNDS) and the choice waits for that lr's runs: a best lr at the
    grid's edge may lie beyond it (the first sweep chose the lowest lr for four of five methods)."""
    grid = list(LRS)
    while True:
        means = {lr: m for lr in grid if (m := _mean_final(cells, method, lr)) is not None}
        chosen = max(sorted(means), key=means.__getitem__) if all(lr in means for lr in LRS) else None
        if chosen is None or len(means) < len(grid):
            return Selection(tuple(grid), tuple(sorted(means)), chosen, done=False)
        if chosen == grid[0] and chosen / 2 >= LR_BOUNDS[0]:
            grid.insert(0, chosen / 2)
        elif chosen == grid[-1] and chosen * 2 <= LR_BOUNDS[1]:
            grid.append(chosen * 2)
        else:
            return Selection(tuple(grid), tuple(grid), chosen, done=True)


def select_lrs(cells: dict[tuple, Cell]) -> dict[str, float | None]:
    """Each method's chosen lr so far (`select`)."""
    return {m: select(cells, m).chosen for m in METHODS}


def plan(
    part: str, cells: dict[tuple, Cell], methods: tuple[str, ...] = METHODS, lags: tuple[int, ...] = LAGS
) -> list[Planned]:
    """The runs PART still needs, in the order they should run. Finished runs and k = 0 cells that are another
    method's run are left out; heldout plans only the methods whose selection is done. `methods` and `lags` narrow
    it to a first slice (say VCPO and the strongest baseline at k = 0, 8, 32, 64: the question answered soonest);
    the report always counts the whole sweep."""
    if part == "calibrate":
        want = [(m, lr, 0, s) for m, lr, s in CALIBRATE if m in methods]
    elif part == "select":  # LRS seed by seed, then the lrs a grid grew by
        want = [(m, lr, SELECT_LAG, s) for s in SELECT_SEEDS for lr in LRS for m in METHODS if m in methods]
        want += [(m, lr, SELECT_LAG, s) for m in METHODS if m in methods for lr in select(cells, m).grid
                 if lr not in LRS for s in SELECT_SEEDS]  # fmt: skip
    elif part == "heldout":
        chosen = {m: sel.chosen for m in METHODS if m in methods and (sel := select(cells, m)).done}
        want = [(m, lr, k, s) for k in LAGS if k in lags for s in HELDOUT_SEEDS for m, lr in chosen.items()]
    else:
        raise ValueError(f"plan: part {part!r} is not one of {', '.join(PARTS)}")
    out, seen = [], set()
    for method, lr, k, seed in want:
        key = (twin(method, k), lr, k, seed)
        if key in cells or key in seen:
            continue
        seen.add(key)
        sets = (f"learner.lr={lr:g}", *OVERRIDES[key[0]].split())
        out.append(Planned(run_name(*key), part, key[0], k, seed, sets))
    return out


def plan_all(cells: dict[tuple, Cell]) -> list[Planned]:
    return [p for part in PARTS for p in plan(part, cells)]


def _names(text: str, known: tuple, what: str, cast=str) -> tuple:
    """--methods vcpo,m2po / --lags 0,8: each item checked against the sweep's own list."""
    items = tuple(cast(x) for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in known]
    if bad or not items:
        raise SystemExit(f"k_sweep: --{what} {text!r}: {bad or 'empty'} not in {', '.join(map(str, known))}")
    return items


# ----------------------------------------------------------------------------------------------------- runner


@dataclass(frozen=True)
class Runner(scored_run.Runner):
    """How `run` trains and scores one planned run: the sweep's recipe, warm start, steps and eval interval."""

    recipe: str = RECIPE
    warm: str = WARM
    steps: int = STEPS
    eval_every: int = EVAL_EVERY


def run_all(
    runner: Runner,
    out: Path,
    jobs: int,
    parts: tuple[str, ...] = PARTS,
    methods: tuple[str, ...] = METHODS,
    lags: tuple[int, ...] = LAGS,
    stop_starting_at: float | None = None,
) -> None:
    """Every missing run of PARTS, `jobs` at a time, re-planning after each finishes (a method's held-out runs
    start as soon as its selection is complete; benchmarks/harness/pool.py); the report is rewritten after every
    `jobs` runs. Once SIGUSR1 came or time.monotonic() passed stop_starting_at, no run starts; the ones training
    finish."""
    from benchmarks.harness.provenance import Provenance
    from benchmarks.stress.k_sweep_report import write

    prov = Provenance()  # this invocation's: a sweep resumed over several has the last one's
    warm = runner.warm_start
    check_same_warm_start(read_cells(runner.runs, out, warm), warm, runner.warm, out)

    def report() -> None:
        write(read_cells(runner.runs, out, warm), out, quiet=True, warm=warm, meta=prov.meta())

    def todo() -> list[Planned]:
        cells = read_cells(runner.runs, out, warm)
        return [p for part in parts for p in plan(part, cells, methods, lags)]

    drained = pool.drain(todo, runner, jobs, "k_sweep", runner.progress, stop_starting_at, report)
    report()
    missing = [p.name for p in plan_all(read_cells(runner.runs, out, warm))]
    print(
        f"k_sweep: {len(missing)} runs missing"
        + (f" (first: {', '.join(missing[:3])})" if missing else "")
        + ("; no run started after SIGUSR1 or --stop-starting-after" if drained else "")
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["plan", "run", "report"])
    ap.add_argument("part", nargs="?", help=f"plan/run: one of {', '.join(PARTS)} (default: all, in order)")
    scored_run.study_args(ap, OUT, WARM)
    ap.add_argument(
        "--methods", default=",".join(METHODS), help="plan/run only these methods (comma-separated)"
    )
    ap.add_argument(
        "--lags", default=",".join(map(str, LAGS)), help="heldout: only these k (comma-separated)"
    )
    args = ap.parse_args(argv)
    if args.part is not None and args.part not in PARTS:
        raise SystemExit(f"k_sweep: part {args.part!r} is not one of {', '.join(PARTS)}")
    parts = (args.part,) if args.part else PARTS
    pool.stop_time(args, "k_sweep")  # a bad value is named before anything starts
    methods = _names(args.methods, METHODS, "methods")
    lags = _names(args.lags, LAGS, "lags", int)
    warm = load_warm_start(args.warm)
    if args.command == "plan":
        cells = read_cells(args.runs, args.out, warm)
        if warm is not None:
            check_same_warm_start(cells, warm, args.warm, args.out)
        runs = [p for part in parts for p in plan(part, cells, methods, lags)]
        for p in runs:
            print(p.name, p.k, p.seed, " ".join(p.sets))
        pending = [m for m in METHODS if m in methods and not select(cells, m).done]
        if "heldout" in parts and pending:
            print(
                f"heldout: the lr selection of {', '.join(pending)} is not done yet (the selection plans it)",
                file=sys.stderr,
            )
        print(f"{'/'.join(parts)}: {len(runs)} runs to go", file=sys.stderr)
        return
    if args.command == "run":
        if warm is None:  # a warm start of your own (--warm DIR): built first (~10 min on one idle core)
            if kept := read_cells(Path(os.devnull), args.out):  # a new one cannot join these: say so first
                raise SystemExit(
                    f"k_sweep: no warm start at {args.warm}, and {len(kept)} runs kept in {args.out} started from "
                    f"one ({next(iter(kept.values())).warm_start}): name it with --warm, or give a new warm start "
                    "its own sweep with --out NEW.json --runs NEW_DIR"
                )
            from benchmarks.stress.multistep_warm import build

            print(f"k_sweep: no warm start at {args.warm}: building it first", flush=True)
            build(Path(args.warm).parent)
            warm = load_warm_start(args.warm)
        pool.on_signals("k_sweep")
        runner = Runner(args.runs, warm, warm=args.warm)
        run_all(runner, args.out, args.jobs, parts, methods, lags, pool.stop_time(args, "k_sweep"))
        return
    from benchmarks.stress.k_sweep_report import write

    src, runs = scored_run.sources(args)
    kept = json.loads(src.read_text()).get("meta") if src.is_file() else None  # the runs' provenance
    write(read_cells(runs, src, warm), args.out, warm=warm, meta=kept)


if __name__ == "__main__":
    main()
