"""Report for `benchmarks/stress/responses.sh`: the collapse monitor's rollback and adapt_staleness responses.

    .venv/bin/python -m benchmarks.stress.responses_report runs benchmarks/results/stress/responses.md
    .venv/bin/python -m benchmarks.stress.responses_report NONE benchmarks/results/stress/responses.md  # from the JSON

rollback: runs/stress_r_rollback_k<K>_s<S> against the `none` part's runs/stress_b_plain_nomaskvoid_k<K>_s<S>
(the same method, lag and seed with no response). adapt_staleness: runs/stress_r_{adapt,fixed}_k<K>_s<S>
(ordinary async runs) against runs/stress_r_fixed_k0_s<S>. Final = held-out accuracy of the final checkpoint
(`benchmarks.stress.final_eval`; under fixed_lag the periodic evals measure the engines' policy, k steps old),
else the last periodic eval; mean ± sample std over seeds (benchmarks/harness/stats.py; 0 from one seed);
collapsed = ended below the warm start (0.25); wall = seconds from the first to the last step's record.
Written by benchmarks/harness/report.py; a cell no run dir fills keeps what the JSON holds.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.harness.report import table, write
from benchmarks.harness.stats import mean_se
from benchmarks.stress import final_eval

WARM_START = 0.25
PATTERNS = {  # run dir name -> the cell's method (None: the name's own)
    r"stress_r_(rollback|adapt|fixed)_k(\d+)_s(\d+)": None,
    r"stress_b_(plain_nomaskvoid)_k(\d+)_s(\d+)": "none (fixed lag)",
}


def _mean(xs: list[float]) -> float | None:
    return statistics.mean(xs) if xs else None


def _load(path: Path) -> dict:
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
    if (final := final_eval.read(path.parent)) is not None:  # the learner's policy at the last step
        evals.append(final)
    return {
        "final": evals[-1] if evals else None, "wall": recs[-1]["time"],
        "rollbacks": max((r.get("monitor/rollbacks", 0.0) for r in recs), default=0.0),
        "warned": any(r.get("monitor/warning") for r in recs),
        "bound_mean": _mean([r["buffer/staleness_bound"] for r in recs if "buffer/staleness_bound" in r]),
        "staleness_mean": _mean([r["buffer/staleness_mean"] for r in recs if "buffer/staleness_mean" in r]),
    }  # fmt: skip


def _cell(runs: list[dict]) -> dict:
    finals = [r["final"] for r in runs if r["final"] is not None]
    m = mean_se(finals)
    return {
        "seeds": len(runs), "final_mean": m.mean, "final_std": m.std or 0.0,
        "collapsed": sum(f < WARM_START for f in finals), "wall_mean": statistics.mean(r["wall"] for r in runs),
        "rollbacks": sum(r["rollbacks"] for r in runs), "warned": sum(r["warned"] for r in runs),
        **{k: _mean([r[k] for r in runs if r[k] is not None]) for k in ("bound_mean", "staleness_mean")},
    }  # fmt: skip


def collect(runs_dir: Path) -> dict[tuple[str, int], dict]:
    by: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for path in sorted(runs_dir.glob("stress_*/metrics.jsonl")):
        steps = json.loads((path.parent / "resolved_config.json").read_text())["train"]["steps"]
        if sum(1 for line in path.read_text().splitlines() if line.strip()) < steps:
            continue  # unfinished
        for pattern, rename in PATTERNS.items():
            if m := re.fullmatch(pattern, path.parent.name):
                by[(rename or m.group(1), int(m.group(2)))].append(_load(path))
    return {key: _cell(rs) for key, rs in by.items()}


def _fmt(c: dict | None) -> str:
    if c is None or c["final_mean"] is None:
        return "-"
    return f"{c['final_mean']:.2f} ± {c['final_std']:.2f}" + (f" [{c['collapsed']}]" if c["collapsed"] else "")  # fmt: skip


def markdown(cells: dict[tuple[str, int], dict]) -> str:
    lines = [
        "# Collapse monitor responses (`benchmarks/stress/responses.sh`)",
        "",
        "Plain REINFORCE, void masking off, tiny_arith from the tiny_tir warm start (0.25), 40 steps. Final = "
        "held-out accuracy of the learner's policy after step 40 (its final checkpoint; cells from runs without "
        "that eval use the last periodic eval, which under a fixed lag is the policy k steps older), mean ± std "
        "over seeds, [n] = collapsed (ended below 0.25).",
        "",
        "## rollback under a fixed lag (every batch exactly k stale)",
        "",
    ]
    rows = []
    for k in sorted({k for m, k in cells if m == "rollback"}):
        none, rb = cells.get(("none (fixed lag)", k)), cells[("rollback", k)]
        seeds = f"{rb['seeds']} seeds" + (f" vs {none['seeds']}" if none else "")
        rows.append([f"{k} ({seeds})", _fmt(none), _fmt(rb), f"{rb['rollbacks']:.0f}", rb["warned"]])
    lines += table(["k", "no response", "rollback", "rollbacks made", "runs that warned (rollback)"], rows)
    lines += ["", "## adapt_staleness in ordinary async runs (buffer.max_staleness = k)", ""]
    sync, rows = cells.get(("fixed", 0)), []
    for k in sorted({k for m, k in cells if m == "adapt"}):
        fixed = cells.get(("fixed", k))
        for mode, c in (("k=0 (sync)", sync), (f"fixed k={k}", fixed), ("adapt_staleness", cells[("adapt", k)])):  # fmt: skip
            if c is not None:
                rows.append([k, mode, c["seeds"], _fmt(c), None if c["bound_mean"] is None else f"{c['bound_mean']:.1f}",
                             None if c["staleness_mean"] is None else f"{c['staleness_mean']:.2f}", f"{c['wall_mean']:.0f}",
                             f"{c['wall_mean'] / sync['wall_mean']:.2f}x" if sync else None,
                             f"{c['wall_mean'] / fixed['wall_mean']:.2f}x" if fixed else None])  # fmt: skip
    lines += table(["k", "mode", "seeds", "final", "mean bound in force", "mean batch staleness", "wall s (mean)",
                    "wall vs k=0", "wall vs fixed k"], rows)  # fmt: skip
    return "\n".join(lines) + "\n"


def keyed(data: dict) -> dict[tuple[str, int], dict]:
    """The cells of a results JSON ('method|k=K' keys) keyed as `collect` keys them."""
    out = {}
    for key, cell in data.items():
        method, _, k = key.rpartition("|k=")
        out[(method, int(k))] = cell
    return out


def earlier_cells(path: Path) -> dict[tuple[str, int], dict]:
    """The cells an earlier report wrote to `path` (a .json), keyed as `collect` keys them."""
    return keyed(json.loads(path.read_text())) if path.is_file() else {}


def main(runs_dir: str, out: str) -> None:
    """Report the finished runs under runs_dir; a cell none of them fills keeps what the earlier report
    (OUT.json) measured, so the study can be completed in parts (its run dirs need not survive)."""
    path = Path(out)
    cells = earlier_cells(path.with_suffix(".json")) | collect(Path(runs_dir))
    data = {f"{m}|k={k}": c for (m, k), c in sorted(cells.items())}
    write(path.stem, data, path.parent, lambda d: markdown(keyed(d)))


if __name__ == "__main__":
    main(*sys.argv[1:3])
