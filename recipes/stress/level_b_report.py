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
    png = Path(out).with_suffix(".png")
    _plot(cells, png)
    print(f"curves: {png}")


def _plot(cells: dict[tuple[str, int], list[dict]], png: Path) -> None:
    """One panel per lag: held-out accuracy at each eval, mean over seeds (band: min-max), per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted({lag for _, lag in cells})
    methods = sorted({m for m, _ in cells})
    color = {m: f"C{i}" for i, m in enumerate(methods)}  # the same colour for a method in every panel
    fig, axes = plt.subplots(1, len(lags), figsize=(4.6 * len(lags), 3.6), sharey=True, squeeze=False)
    for ax, lag in zip(axes[0], lags, strict=True):
        for (method, k), runs_ in sorted(cells.items()):
            if k != lag:
                continue
            n = min(len(r["curve"]) for r in runs_)
            steps = [10 * (i + 1) for i in range(n)]
            cols = [[r["curve"][i] for r in runs_] for i in range(n)]
            ax.plot(steps, [statistics.mean(c) for c in cols], marker="o", color=color[method],
                    label=f"{method} ({len(runs_)})")  # fmt: skip
            ax.fill_between(
                steps, [min(c) for c in cols], [max(c) for c in cols], color=color[method], alpha=0.15
            )
        ax.axhline(WARM_START, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"k = {lag}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("held-out accuracy")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main(*sys.argv[1:3])
