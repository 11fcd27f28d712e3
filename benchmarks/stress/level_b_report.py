"""Level (b) report: the stabiliser comparison through the full stack, and its per-step series.

    .venv/bin/python -m benchmarks.stress.level_b_report runs benchmarks/results/stress/level_b_stabilisers.md

Reads every runs/stress_b_<method>_k<K>_s<S>/metrics.jsonl; writes level_b_stabilisers.md (table: final held-out
accuracy mean ± std over seeds, collapses, k* per method; VCPO against the best baseline at each k),
level_b_stabilisers.png (curves) and runs_b.jsonl.gz (one line per run: every step's ESS/B, grad norm, max IS
weight, KL(behaviour || current), lr scale, staleness bound in force, plus the held-out curve), which
`benchmarks.stress.monitor_eval` reads to calibrate the collapse warning.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.harness.report import write
from benchmarks.harness.stats import Gap, MeanSE, difference, mean_se
from benchmarks.stress import final_eval

WARM_START = 0.25  # held-out accuracy of runs/tiny_tir/sft, the runs' starting point
TOLERANCE = 0.9  # k*: largest k with every k' <= k at >= 90 % of sync
SAME_AS_PLAIN_AT_K0 = ("tis_nomaskvoid", "mis_nomaskvoid", "m2po_nomaskvoid")
ORDER = ("plain_nomaskvoid", "tis_nomaskvoid", "mis_nomaskvoid", "m2po_nomaskvoid", "vcpo_nomaskvoid", "vcpo")
LABEL = {
    "plain_nomaskvoid": "plain REINFORCE",
    "tis_nomaskvoid": "TIS (seq)",
    "mis_nomaskvoid": "masking (mis)",
    "m2po_nomaskvoid": "M2PO",
    "vcpo_nomaskvoid": "VCPO",
    "vcpo": "VCPO, void masking on",
    "plain": "plain REINFORCE, void masking on",
}
SERIES = {  # runs_b.jsonl.gz field -> metrics.jsonl key (steps the learner skipped have none)
    "ess_ratio": "vcpo/ess_ratio",
    "grad_norm": "learner/grad_norm",
    "is_weight_max": "vcpo/is_weight_max",
    "kl": "vcpo/kl_behavior_current",
    "log_ratio_abs_max": "vcpo/log_ratio_abs_max",
    "lr_scale": "vcpo/lr_scale",
}


def load_run(path: Path) -> dict:
    method, lag, seed = re.match(r"stress_b_(\w+?)_k(\d+)_s(\d+)", path.parent.name).groups()
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    trained = [r for r in recs if "vcpo/ess_ratio" in r]
    evals = [r for r in recs if "eval/accuracy" in r]
    return {
        "name": path.parent.name, "method": method, "lag": int(lag), "seed": int(seed),
        "steps": [int(r["step"]) for r in trained],
        **{field: [r[key] for r in trained] for field, key in SERIES.items()},
        "skipped_steps": [int(r["step"]) for r in recs if r.get("learner/skipped", 0)],
        "staleness_bound": [r.get("monitor/staleness_bound") for r in recs],
        "monitor_warning": [int(r["step"]) for r in recs if r.get("monitor/warning", 0)],
        "eval_steps": [int(r["step"]) for r in evals],  # the step index after whose update it ran
        "eval_accuracy": [r["eval/accuracy"] for r in evals],  # of the engines' policy: k versions behind
        "final_accuracy": final_eval.read(path.parent),  # of the learner's policy after the last step
        "train_reward": [r["rollout/reward_mean"] for r in recs],
        "wall_seconds": recs[-1]["time"] if recs else 0.0,
    }  # fmt: skip


def policy_curve(run: dict) -> tuple[list[int], list[float]]:
    """The held-out curve against the learner step whose policy was evaluated. Under fixed_lag=k the periodic
    eval runs on the engines, which hold version t+1-k after step t: the policy of step t-k (-1: the warm
    start). The final checkpoint's eval, when there is one, is the policy of the last step."""
    steps = [max(-1, t - run["lag"]) for t in run["eval_steps"]]
    accs = list(run["eval_accuracy"])
    if run.get("final_accuracy") is not None:
        steps.append(run["steps"][-1] if run["steps"] else run["eval_steps"][-1])
        accs.append(run["final_accuracy"])
    return steps, accs


def final_accuracy(run: dict) -> float:
    """The learner's policy at the last step; without a final checkpoint eval, the last periodic eval (which
    under fixed_lag=k is the policy k steps earlier)."""
    final = run.get("final_accuracy")
    return run["eval_accuracy"][-1] if final is None else final


def load_runs(runs_dir: str | Path) -> list[dict]:
    """Finished runs only (as many step records as the run's train.steps)."""
    out = []
    for p in sorted(Path(runs_dir).glob("stress_b_*_k*_s*/metrics.jsonl")):
        steps = json.loads((p.parent / "resolved_config.json").read_text())["train"]["steps"]
        if sum(1 for line in p.read_text().splitlines() if line.strip()) >= steps:
            out.append(load_run(p))
    return out


def _cells(runs: list[dict]) -> dict[tuple[str, int], list[dict]]:
    cells: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in runs:
        if r["eval_accuracy"]:
            cells[(r["method"], r["lag"])].append(r)
    return cells


def _final(runs: list[dict]) -> list[float]:
    return [final_accuracy(r) for r in runs]


def _lagged(runs: list[dict]) -> int:
    """Runs whose final is a lagged periodic eval (k > 0 and no final checkpoint eval)."""
    return sum(r["lag"] > 0 and r.get("final_accuracy") is None for r in runs)


def comparison(runs: list[dict]) -> dict:
    """Per method and k: final accuracy over seeds, collapses; k* per method; VCPO vs the best baseline."""
    cells = _cells(runs)
    # sync: the best method at k = 0 (plain REINFORCE can collapse on-policy here, so it is not the reference)
    k0 = {m: statistics.mean(_final(rs)) for (m, k), rs in cells.items() if k == 0}
    sync_method = max(k0, key=k0.get) if k0 else None
    sync = k0[sync_method] if sync_method else None
    lags = sorted({k for _, k in cells})
    table: dict[str, dict[int, dict]] = {}
    for method in [m for m in ORDER if any(mm == m for mm, _ in cells)] + sorted(
        {m for m, _ in cells} - set(ORDER)
    ):
        row = {}
        for k in lags:
            rs = cells.get((method, k)) or (
                cells.get(("plain_nomaskvoid", 0)) if k == 0 and method in SAME_AS_PLAIN_AT_K0 else None
            )
            if not rs:
                continue
            m = mean_se(_final(rs))
            row[k] = {
                "seeds": len(rs), "mean": m.mean, "std": m.std or 0.0, "collapsed": sum(f < WARM_START for f in _final(rs)),
                "same_as_plain": (method, k) not in cells, "lagged_finals": _lagged(rs),
            }  # fmt: skip
        table[method] = row
    k_star, k_within = {}, {}
    for method, row in table.items():
        best = None
        for k in lags:  # a lag this method did not run ends the chain: k* claims only what was measured
            if sync is None or k not in row or row[k]["mean"] < TOLERANCE * sync:
                break
            best = k
        k_star[method] = best
        k_within[method] = [k for k in sorted(row) if sync is not None and row[k]["mean"] >= TOLERANCE * sync]
    versus = {}
    baselines = ("plain_nomaskvoid", "tis_nomaskvoid", "mis_nomaskvoid", "m2po_nomaskvoid")
    for k in lags:
        if k == 0 or k not in table.get("vcpo_nomaskvoid", {}):
            continue
        base = [(m, table[m][k]) for m in baselines if k in table.get(m, {})]
        if not base:
            continue
        m, b = max(base, key=lambda mb: mb[1]["mean"])
        v = table["vcpo_nomaskvoid"][k]
        # the 2-SE rule of benchmarks/harness/stats.py: SE of each mean = std / sqrt(seeds), of the gap their
        # root sum of squares (separate runs); "separated" at 2 SE of the gap or more
        gap = difference(
            MeanSE(v["mean"], v["std"] / math.sqrt(v["seeds"]), v["seeds"]),
            MeanSE(b["mean"], b["std"] / math.sqrt(b["seeds"]), b["seeds"]),
        )
        versus[k] = {
            "best_baseline": m, "baseline_mean": b["mean"], "baseline_std": b["std"], "vcpo_mean": v["mean"],
            "vcpo_std": v["std"], "difference": gap.diff, "difference_se": gap.se, "separated": gap.separated,
            "side": gap.side("ahead", "behind", "level"),
        }  # fmt: skip
    return {
        "sync": sync,
        "sync_method": sync_method,
        "lags": lags,
        "table": table,
        "k_star": k_star,
        "k_within_tolerance": k_within,
        "vcpo_vs_best_baseline": versus,
    }


def markdown(cmp: dict, n_runs: int) -> str:
    lags = cmp["lags"]
    sync = cmp["sync"]
    lines = [
        "# Staleness study, level (b): stabiliser comparison through the full stack (`benchmarks/stress/level_b.sh`)",
        "",
        f"{n_runs} runs. Warm start: recipes/tiny_tir (held-out accuracy {WARM_START}); 8 prompts x 8 samples "
        "per step, lr 5e-4, every batch exactly k versions stale (`rollout.fixed_lag`); void-turn masking off "
        "unless the row says on. Final = held-out accuracy of the learner's policy after the last step (its "
        "final checkpoint, `benchmarks.stress.final_eval`; 100 tasks, T=1), mean ± std over seeds; †n = n seeds "
        "without that eval, whose final is the last periodic eval: the engines' policy, k steps older; [n] = collapsed (ended below the warm start); k* = largest k with every "
        f"k' <= k run and at >= 90 % of sync; k at 90 % = each k whose mean is at >= 90 % of sync (the best method at k = 0: {LABEL.get(cmp['sync_method'], cmp['sync_method'])}, "
        f"{sync if sync is None else f'{sync:.2f}'}). "
        "k = 0 of tis/mis/m2po is plain's run (the same update when every IS weight is 1).",
        "",
        "| method | " + " | ".join(f"k={k}" for k in lags) + " | k* | k at 90 % |",
        "|---|" + "---|" * (len(lags) + 2),
    ]
    for method, row in cmp["table"].items():
        cells = []
        for k in lags:
            c = row.get(k)
            if c is None:
                cells.append("")
                continue
            txt = f"{c['mean']:.2f} ± {c['std']:.2f}" + (f" [{c['collapsed']}]" if c["collapsed"] else "")
            txt += f" †{c['lagged_finals']}" if c.get("lagged_finals") else ""
            cells.append(
                ("(= plain)" if c["same_as_plain"] else txt)
                + ("" if c["seeds"] >= 5 else f" ({c['seeds']} seeds)")
            )
        ks = cmp["k_star"].get(method)
        lines.append(
            f"| {LABEL.get(method, method)} | "
            + " | ".join(cells)
            + f" | {'-' if ks is None else ks} | "
            + (", ".join(map(str, cmp["k_within_tolerance"].get(method, []))) or "-")
            + " |"
        )
    lines += ["", "VCPO (masking off) against the best baseline at each k (means ± std over seeds; the gap ± its "
              "standard error, \"ahead\"/\"behind\" only at 2 SE or more, \"level\" otherwise):", ""]  # fmt: skip
    words = {"ahead": "is ahead of", "behind": "is behind", "level": "is level with"}
    for k, v in cmp["vcpo_vs_best_baseline"].items():
        lines.append(
            f"- k={k}: VCPO {v['vcpo_mean']:.2f} ± {v['vcpo_std']:.2f} {words[v['side']]} the best baseline "
            f"({LABEL.get(v['best_baseline'], v['best_baseline'])}, {v['baseline_mean']:.2f} ± {v['baseline_std']:.2f}): "
            f"{Gap(v['difference'], v['difference_se']).text()}."
        )
    return "\n".join(lines) + "\n"


def write_series(runs: list[dict], path: Path) -> None:
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in runs).encode()))


def read_series(path: Path) -> list[dict]:
    """The runs an earlier report packed (empty when there is none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line]


def main(runs_dir: str, out: str) -> None:
    """Report the finished runs under runs_dir together with those an earlier report packed into
    runs_b.jsonl.gz (a run dir wins over its packed copy), so a study can be completed in parts."""
    out_path = Path(out)
    fresh = load_runs(runs_dir)
    names = {r["name"] for r in fresh}
    earlier = [r for r in read_series(out_path.with_name("runs_b.jsonl.gz")) if r["name"] not in names]
    runs = sorted(fresh + earlier, key=lambda r: r["name"])
    write_series(runs, out_path.with_name("runs_b.jsonl.gz"))
    write(out_path.stem, comparison(runs), out_path.parent, lambda cmp: markdown(cmp, len(runs)))
    png = out_path.with_suffix(".png")
    _plot(_cells(runs), png)
    print(f"curves: {png}; per-step series: {out_path.with_name('runs_b.jsonl.gz')}")


def _plot(cells: dict[tuple[str, int], list[dict]], png: Path) -> None:
    """One panel per lag: held-out accuracy at each eval, mean over seeds (band: min-max), per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted({lag for _, lag in cells})
    methods = [m for m in ORDER if any(mm == m for mm, _ in cells)] + sorted(
        {m for m, _ in cells} - set(ORDER)
    )
    color = {m: f"C{i}" for i, m in enumerate(methods)}  # the same colour for a method in every panel
    fig, axes = plt.subplots(1, len(lags), figsize=(4.6 * len(lags), 3.6), sharey=True, squeeze=False)
    for ax, lag in zip(axes[0], lags, strict=True):
        for method in methods:
            runs_ = cells.get((method, lag))
            if not runs_:
                continue
            curves = [policy_curve(r) for r in runs_]
            n = min(len(a) for _, a in curves)
            steps = curves[0][0][:n]
            cols = [[a[i] for _, a in curves] for i in range(n)]
            ax.plot(steps, [statistics.mean(c) for c in cols], marker="o", color=color[method],
                    label=f"{LABEL.get(method, method)} ({len(runs_)})")  # fmt: skip
            ax.fill_between(
                steps, [min(c) for c in cols], [max(c) for c in cols], color=color[method], alpha=0.15
            )
        ax.axhline(WARM_START, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"k = {lag}")
        ax.set_xlabel("learner step of the policy evaluated")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("held-out accuracy")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main(*sys.argv[1:3])
