"""Level (b), lr-matched: every stabiliser at its best learning rate against VCPO, and VCPO's parts ablated.

    benchmarks/stress/level_b_fair.sh select|heldout|fill|ablate|report   # = the `run PART` below, or `report`
    nice -n 15 .venv/bin/python -m benchmarks.stress.level_b_fair run PART [--jobs N] [--stop-starting-after MIN]
    .venv/bin/python -m benchmarks.stress.level_b_fair plan PART        # the runs PART still needs, one per line
    .venv/bin/python -m benchmarks.stress.level_b_fair report           # -> benchmarks/results/stress/level_b_fair.*
    .venv/bin/python -m benchmarks.stress.level_b_fair report --from-results F --out F  # from F's kept runs alone

The design (issue 28): tiny_tir warm start, fixed lag k, void-turn masking off, 40 steps, scored by the final
checkpoint's held-out accuracy (`final_eval`). Baselines (plain, tis, mis, m2po) run at each lr of LRS on the
selection seeds at k = 4; each method's lr is the one with the highest mean there, and only that lr is scored on
the held-out seeds at k in LAGS. VCPO runs at the recipe's lr (RECIPE_LR, no selection) and, with its two parts
alone (ess_lr: the ESS-scaled lr on the GRPO baseline; opob: the OPOB baseline without lr scaling), at every lr of
LRS on the held-out seeds. At k = 0 every IS weight is 1 and ESS/B = 1, so tis/mis/m2po/ess_lr make plain's update
and opob makes VCPO's: those cells are plain's and VCPO's runs (`same_as`).

`fill` (issue 39) is the part of `ablate` the verdict table reads: at every k, VCPO at the best baseline's own lr
and each part alone at the recipe's lr, so that "VCPO at the baseline's lr" exists for every k.

`run` trains each planned run in its own process (`agent-rl train recipes/tiny_tir.yaml` from the warm start WARM,
STEPS steps, no periodic eval: the final checkpoint is what is scored; benchmarks/harness/pool.py, `--jobs` at a time,
drained by SIGUSR1 or --stop-starting-after, stopped by SIGTERM), scores its final checkpoint (`final_eval`) and
drops its checkpoints (benchmarks/stress/scored_run.py, as the k-sweep's runs); the report is rewritten as they
finish. Resumable: a run counts once its final_eval.json exists; the report also keeps the cells an earlier report
wrote (level_b_fair.json), so a study can be finished in another session after its run dirs are gone.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import pool
from benchmarks.stress import final_eval
from benchmarks.stress.scored_run import Planned, Runner, sources, study_args

LRS = (5e-5, 1.5e-4, 5e-4)
RECIPE_LR = 5e-4
LAGS = (0, 4, 8)
SELECT_LAG = 4
SELECT_SEEDS = (0, 1, 2)
HELDOUT_SEEDS = (3, 4, 5, 6, 7)
BASELINES = ("plain", "tis", "mis", "m2po")
ABLATIONS = ("ess_lr", "opob", "vcpo")
WARM_START = 0.25  # held-out accuracy of the warm start; a run that ends below it collapsed
SAME_AS_AT_K0 = {"tis": "plain", "mis": "plain", "m2po": "plain", "ess_lr": "plain", "opob": "vcpo"}
OVERRIDES = {  # method -> recipe overrides (recipes/tiny_tir.yaml is VCPO: seq-TIS + proxy OPOB + sqrt ESS lr)
    "plain": "algorithm.loss=reinforce algorithm.advantage=grpo algorithm.ess_lr_rule=none",
    "tis": "algorithm.loss=tis_seq algorithm.advantage=grpo algorithm.ess_lr_rule=none",
    "mis": "algorithm.loss=mis algorithm.advantage=grpo algorithm.ess_lr_rule=none",
    "m2po": "algorithm.loss=m2po algorithm.advantage=grpo algorithm.ess_lr_rule=none",
    "ess_lr": "algorithm.advantage=grpo",
    "opob": "algorithm.ess_lr_rule=none",
    "vcpo": "",
}
LABEL = {"plain": "plain REINFORCE", "tis": "TIS (seq)", "mis": "masking (MIS)", "m2po": "M2PO",
         "ess_lr": "ESS lr alone", "opob": "OPOB alone", "vcpo": "VCPO"}  # fmt: skip
NAME = re.compile(r"stress_f_(\w+?)_lr([0-9.e-]+)_k(\d+)_s(\d+)$")
PARTS = ("select", "heldout", "fill", "ablate")
RECIPE, WARM, STEPS = "recipes/tiny_tir.yaml", "runs/tiny_tir/sft", 40
OUT = Path("benchmarks/results/stress/level_b_fair.json")


@dataclass(frozen=True)
class Cell:
    """One finished run: the method, lr, lag and seed it ran, and its final checkpoint's held-out accuracy."""

    method: str
    lr: float
    k: int
    seed: int
    final_accuracy: float

    @property
    def collapsed(self) -> bool:
        return self.final_accuracy < WARM_START

    def row(self) -> dict:
        return asdict(self) | {"collapsed": self.collapsed}


def run_name(method: str, lr: float, k: int, seed: int) -> str:
    return f"stress_f_{method}_lr{lr:g}_k{k}_s{seed}"


def read_cells(runs_dir: Path, earlier: Path | None = None) -> dict[tuple, Cell]:
    """Every finished run (final_eval.json written) under runs_dir, plus the cells an earlier report kept;
    a run dir wins over its kept copy. Keyed by (method, lr, k, seed)."""
    cells: dict[tuple, Cell] = {}
    if earlier is not None and earlier.is_file():
        for c in json.loads(earlier.read_text())["cells"]:
            cell = Cell(c["method"], float(c["lr"]), int(c["k"]), int(c["seed"]), float(c["final_accuracy"]))
            cells[(cell.method, cell.lr, cell.k, cell.seed)] = cell
    for path in sorted(runs_dir.glob("stress_f_*/final_eval.json")):
        m = NAME.match(path.parent.name)
        if m is None:
            continue
        method, lr, k, seed = m.group(1), float(m.group(2)), int(m.group(3)), int(m.group(4))
        cells[(method, lr, k, seed)] = Cell(method, lr, k, seed, final_eval.read(path.parent))
    return cells


def accuracies(
    cells: dict[tuple, Cell], method: str, lr: float, k: int, seeds: tuple[int, ...]
) -> list[float]:
    """The finals of (method, lr, k) over these seeds that have run (k = 0 of a same-as method: its twin's)."""
    if k == 0:
        method = SAME_AS_AT_K0.get(method, method)
    return [cells[key].final_accuracy for s in seeds if (key := (method, lr, k, s)) in cells]


def select_lrs(cells: dict[tuple, Cell]) -> dict[str, float | None]:
    """Each baseline's lr: the highest mean final at k = SELECT_LAG over the selection seeds (ties: the first lr
    in LRS). None until every lr has every selection seed: a partial selection picks nothing. Held-out seeds
    are never read here."""
    chosen: dict[str, float | None] = {}
    for method in BASELINES:
        means = {}
        for lr in LRS:
            accs = accuracies(cells, method, lr, SELECT_LAG, SELECT_SEEDS)
            if len(accs) == len(SELECT_SEEDS):
                means[lr] = statistics.mean(accs)
        chosen[method] = max(means, key=lambda lr: means[lr]) if len(means) == len(LRS) else None
    return chosen


def best_baseline(cells: dict[tuple, Cell], k: int) -> tuple[str, float] | None:
    """The baseline with the highest held-out mean at its chosen lr at lag k, and that lr (None until one has a
    held-out seed). The same pick as the report's verdict row."""
    means = {}
    for method, lr in select_lrs(cells).items():
        if lr is not None and (accs := accuracies(cells, method, lr, k, HELDOUT_SEEDS)):
            means[(method, lr)] = statistics.mean(accs)
    return max(means, key=lambda m: means[m]) if means else None


def plan(part: str, cells: dict[tuple, Cell]) -> list[Planned]:
    """The runs PART still needs, in priority order. Runs already finished and k = 0 cells that are another
    method's run are left out."""
    want: list[tuple[str, float, int, int]] = []
    if part == "select":
        want = [(m, lr, SELECT_LAG, s) for s in SELECT_SEEDS for lr in LRS for m in BASELINES]
    elif part == "heldout":
        chosen = select_lrs(cells)
        picks = [("vcpo", RECIPE_LR)] + [(m, lr) for m, lr in chosen.items() if lr is not None]
        want = [(m, lr, k, s) for k in (4, 8, 0) for s in HELDOUT_SEEDS for m, lr in picks]
    elif part == "fill":
        # the verdict table's cells: VCPO at the best baseline's lr, each part at the recipe's lr
        for k in LAGS:
            best = best_baseline(cells, k)
            picks = [("vcpo", best[1])] if best else []
            picks += [("ess_lr", RECIPE_LR), ("opob", RECIPE_LR)]
            want += [(m, lr, k, s) for m, lr in picks for s in HELDOUT_SEEDS]
    elif part == "ablate":
        chosen = [lr for lr in select_lrs(cells).values() if lr is not None]
        # the lrs most baselines chose first, the recipe lr, the rest
        order = sorted({lr for lr in chosen if lr != RECIPE_LR}, key=lambda lr: -chosen.count(lr))
        order += [RECIPE_LR]
        order += [lr for lr in LRS if lr not in order]
        # VCPO first at each lr: "VCPO at the baseline's lr" says whether the gap was the learning rate
        methods = ("vcpo", *(m for m in ABLATIONS if m != "vcpo"))
        want = [(m, lr, k, s) for lr in order for k in (4, 8, 0) for m in methods for s in HELDOUT_SEEDS]
    else:
        raise ValueError(f"plan: part {part!r} is not one of {', '.join(PARTS)}")
    out, seen = [], set()
    for method, lr, k, seed in want:
        if k == 0:
            method = SAME_AS_AT_K0.get(method, method)
        key = (method, lr, k, seed)
        if key in cells or key in seen:
            continue
        seen.add(key)
        sets = (f"learner.lr={lr:g}", "buffer.mask_void=false", *OVERRIDES[method].split())
        out.append(Planned(run_name(method, lr, k, seed), part, method, k, seed, sets))
    return out


def run(part: str, runs: Path, out: Path, jobs: int, warm: str, stop_starting_at: float | None) -> None:
    """Every run PART still needs, `jobs` at a time (benchmarks/harness/pool.py), the report rewritten as they
    finish; SIGUSR1 or stop_starting_at (time.monotonic()): no run starts, the ones training finish."""
    from benchmarks.stress.level_b_fair_report import write

    if not (Path(warm) / "model.safetensors").is_file():
        raise SystemExit(
            f"level_b_fair: no warm start at {warm}: run 'make run' first (or name one with --warm DIR)"
        )
    from benchmarks.harness.provenance import Provenance

    pool.on_signals("level_b_fair")
    prov = Provenance()  # this invocation's: a study resumed over several has the last one's

    def report() -> None:
        write(read_cells(runs, out), out, quiet=True, meta=prov.meta())

    runner = Runner(runs, None, RECIPE, warm, STEPS, eval_every=0)
    drained = pool.drain(lambda: plan(part, read_cells(runs, out)), runner, jobs, "level_b_fair", runner.progress,
                         stop_starting_at, report)  # fmt: skip
    report()
    left = len(plan(part, read_cells(runs, out)))
    print(f"level_b_fair {part}: {left} runs missing"
          + ("; no run started after SIGUSR1 or --stop-starting-after" if drained else ""))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["plan", "run", "report"])
    ap.add_argument("part", nargs="?", help=f"plan, run: {' | '.join(PARTS)}")
    study_args(ap, OUT, WARM)
    args = ap.parse_args(argv)
    if args.command in ("plan", "run") and args.part not in PARTS:
        raise SystemExit(f"level_b_fair: part {args.part!r} is not one of {', '.join(PARTS)}")
    if args.command == "run":
        run(args.part, args.runs, args.out, args.jobs, args.warm, pool.stop_time(args, "level_b_fair"))
        return
    src, runs = sources(args)
    cells = read_cells(runs, src)
    if args.command == "plan":
        runs = plan(args.part, cells)
        pending = [m for m, lr in select_lrs(cells).items() if lr is None]
        if args.part == "heldout" and pending:
            print(f"heldout: no lr chosen yet for {', '.join(pending)} (finish `level_b_fair.sh select` first); "
                  "planning the others", file=sys.stderr)  # fmt: skip
        for p in runs:
            print(p.name, p.k, p.seed, " ".join(f"--set {s}" for s in p.sets))
        print(f"{args.part}: {len(runs)} runs to go", file=sys.stderr)
        return
    from benchmarks.stress.level_b_fair_report import write

    write(
        cells, args.out, meta=json.loads(src.read_text()).get("meta") if src.is_file() else None
    )  # runs' provenance


if __name__ == "__main__":
    main()
