"""Table for level (b): held-out accuracy of the current policy per (method, lag), over seeds."""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

WARM_START = 0.25  # held-out accuracy of runs/tiny_tir/sft, the runs' starting point


def main(runs: str, out: str) -> None:
    cells: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
    for path in sorted(Path(runs).glob("stress_b_*_k*_s*/metrics.jsonl")):
        method, lag, _ = re.match(r"stress_b_(\w+?)_k(\d+)_s(\d+)", path.parent.name).groups()
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        evals = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
        ess = sorted(r["vcpo/ess_ratio"] for r in recs if "vcpo/ess_ratio" in r)  # not on skipped steps
        skipped = sum(int(r.get("learner/skipped", 0)) for r in recs)
        cells[(method, int(lag))].append(
            {"final": evals[-1], "curve": evals, "ess_min": ess[0], "ess_med": ess[len(ess) // 2],
             "skipped": skipped}
        )  # fmt: skip
    lines = [
        "# Staleness study, level (b): full stack on tiny_arith (`recipes/stress/level_b.sh`)",
        "",
        "Warm start: recipes/tiny_tir (held-out accuracy 0.25). 40 steps of 8 prompts x 8 samples, lr 5e-4,",
        "every batch exactly k versions stale (`rollout.fixed_lag`). Held-out accuracy of the current policy",
        "(100 tasks, T=1) at steps 10/20/30/40. Collapsed: final accuracy below the warm start. Skipped:",
        "steps whose trajectories were all masked (void turns), so the learner made no update.",
        "",
        "| method | k | seeds | final accuracy | collapsed | curves (steps 10/20/30/40) | ESS/B min | ESS/B median "
        "| skipped steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (method, lag), runs_ in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        finals = [r["final"] for r in runs_]
        spread = f" ± {statistics.stdev(finals):.2f}" if len(finals) > 1 else ""
        curves = "; ".join("/".join(f"{x:.2f}" for x in r["curve"]) for r in runs_)
        lines.append(
            f"| {method} | {lag} | {len(runs_)} | {statistics.mean(finals):.2f}{spread} | "
            f"{sum(f < WARM_START for f in finals)}/{len(finals)} | {curves} | "
            f"{min(r['ess_min'] for r in runs_):.2f} | {statistics.median(r['ess_med'] for r in runs_):.2f} | "
            f"{sum(r['skipped'] for r in runs_)} |"
        )
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:3])
