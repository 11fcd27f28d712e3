"""Tables and curves from the grid's runs: summary.json, summary.md, curves.png.

Definitions (also printed at the top of summary.md):
- final held-out reward: greedy reward of the current policy on the held-out prompts, the
  mean of a run's last `FINAL_EVALS` evaluations; mean ± std over seeds.
- mean over run: the mean of a run's whole held-out curve (how fast it learned), mean over seeds.
- ESS/B: per step from vcpo; per run its minimum and median over steps; the table gives the
  median over seeds of each.
- collapsed: the run raised (non-finite numbers), ended below a random policy (final < 0.05;
  uniform tokens score ≈ 0.07: the policy has locked onto a wrong deterministic answer), or
  lost more than half of what it had gained (final < peak - (peak - initial)/2, with
  peak - initial >= 0.1).
- k*: the largest k such that every k' <= k in the grid has mean final reward >= 90 % of sync's
  (plain at k = 0, same lr).
- step time vs plain: from steptime.json (`python -m benchmarks.stress.steptime`: every method steps
  the same stale batch, interleaved, in one process) when it exists; otherwise the ratio of the
  grid's median vcpo.Step seconds, which mostly measures how loaded the machine was at the time.
- k = 0 rows marked "= plain" (or "= vcpo") reuse that method's runs: with behaviour = current
  every IS weight is 1 and the ESS lr scale is 1, so the update is the same one.
"""

from __future__ import annotations

import json
import statistics as st
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.harness.report import save_figure, subplots, table
from benchmarks.stress.run import METHODS
from benchmarks.stress.study import StudyConfig

FINAL_EVALS = 3
TOLERANCE = 0.9
BELOW_RANDOM = 0.05
SAME_AT_K0 = {
    "tis": "plain", "mis": "plain", "m2po": "plain", "ess_lr": "plain", "opob": "vcpo", "opob[exact]": "vcpo[exact]",
}  # fmt: skip


@dataclass
class Cell:
    method: str
    lag: int
    lr: float
    seeds: int
    final_mean: float
    final_std: float
    auc_mean: float
    ess_min: float
    ess_median: float
    is_weight_max: float
    log_ratio_max: float
    kl_median: float
    grad_norm_median: float
    collapsed: int
    learner_seconds: float
    same_as: str | None = None  # a k = 0 row borrowed from the method whose update it equals


def label(cfg: dict, default_mode: str) -> str:
    """Method name; OPOB runs in the non-default mode are their own rows, e.g. "vcpo[exact]"."""
    m = cfg["method"]
    if METHODS[m]["advantage"] == "opob" and cfg["opob_mode"] != default_mode:
        return f"{m}[{cfg['opob_mode']}]"
    return m


def order(labels: set[str]) -> list[str]:
    return [m for m in METHODS if m in labels] + sorted(labels - set(METHODS))


def final_reward(r: dict) -> float:
    return st.fmean(r["heldout_reward"][-FINAL_EVALS:])


def collapsed(r: dict) -> bool:
    h = r["heldout_reward"]
    if r["error"]:
        return True
    peak, first, last = max(h), h[0], final_reward(r)
    return last < BELOW_RANDOM or (peak - first >= 0.1 and last < peak - (peak - first) / 2)


def _med(xs: list[float]) -> float:
    return st.median(xs) if xs else float("nan")


def summarise(runs: list[dict], default_mode: str) -> list[Cell]:
    by: dict[tuple[str, int, float], list[dict]] = defaultdict(list)
    for r in runs:
        c = r["config"]
        by[(label(c, default_mode), c["lag"], c["lr"])].append(r)
    cells = []
    for (method, lag, lr), rs in sorted(by.items()):
        finals = [final_reward(r) for r in rs]
        cells.append(
            Cell(
                method=method, lag=lag, lr=lr, seeds=len(rs),
                final_mean=st.fmean(finals), final_std=st.pstdev(finals) if len(finals) > 1 else 0.0,
                auc_mean=st.fmean(st.fmean(r["heldout_reward"]) for r in rs),
                ess_min=_med([min(r["ess_ratio"]) for r in rs if r["ess_ratio"]]),
                ess_median=_med([st.median(r["ess_ratio"]) for r in rs if r["ess_ratio"]]),
                is_weight_max=max((max(r["is_weight_max"]) for r in rs if r["is_weight_max"]), default=0.0),
                log_ratio_max=max((max(r["log_ratio_abs_max"]) for r in rs if r["log_ratio_abs_max"]), default=0.0),
                kl_median=_med([st.median(r["kl"]) for r in rs if r["kl"]]),
                grad_norm_median=_med([st.median(r["grad_norm"]) for r in rs if r["grad_norm"]]),
                collapsed=sum(collapsed(r) for r in rs),
                learner_seconds=_med([st.median(r["learner_seconds"]) for r in rs if r["learner_seconds"]]),
            )
        )  # fmt: skip
    have = {(c.method, c.lag, c.lr) for c in cells}
    for c in [c for c in cells if c.lag == 0]:
        for m, same in SAME_AT_K0.items():
            if (
                same == c.method
                and (m, 0, c.lr) not in have
                and any(x.method == m and x.lr == c.lr for x in cells)
            ):
                cells.append(replace(c, method=m, same_as=same))
    return cells


def k_star(cells: list[Cell], method: str, lr: float, sync: float) -> int | None:
    """Largest k with every k' <= k at >= 90 % of sync's final reward; None if k = 0 already fails."""
    best = None
    for c in sorted((c for c in cells if c.method == method and c.lr == lr), key=lambda c: c.lag):
        if c.final_mean < TOLERANCE * sync:
            break
        best = c.lag
    return best


def _sync(cells: list[Cell], lr: float) -> float | None:
    ref = [c for c in cells if c.method == "plain" and c.lag == 0 and c.lr == lr]
    return ref[0].final_mean if ref else None


def _overhead(cells: list[Cell], method: str, lr: float) -> float | None:
    mine = [c.learner_seconds for c in cells if c.method == method and c.lr == lr and not c.same_as]
    base = [c.learner_seconds for c in cells if c.method == "plain" and c.lr == lr]
    return st.median(mine) / st.median(base) if mine and base else None


def _bench_ratio(bench: dict | None, method: str, default_mode: str) -> float | None:
    if bench is None:
        return None
    key = method if "[" in method else f"{method}[{default_mode}]"
    entry = bench["methods"].get(key)
    return None if entry is None else entry["vs_plain"]


def markdown(study: StudyConfig, cells: list[Cell], n_runs: int, bench: dict | None = None) -> str:
    lines = [
        "# Staleness study (level a): fast grid",
        "",
        f"{n_runs} runs. Task: count from a in steps of s mod 10 (4 answer tokens), 66k-parameter GRU, "
        f"Adam, {study.batch_prompts} prompts x {study.group_size} samples per step, {study.steps} steps, "
        f"OPOB mode `{study.opob_mode}` unless a row says otherwise. Held-out: 20 (a, s) prompts never "
        "sampled in training, greedy decoding.",
        "",
        (__doc__ or "")
        .split("Definitions", 1)[1]
        .strip()
        .replace("(also printed at the top of summary.md):", ""),
        "",
    ]
    lrs = sorted({c.lr for c in cells}, key=lambda lr: (lr != study.reference_lr, lr))
    for lr in lrs:
        sync = _sync(cells, lr)
        tag = " (reference)" if lr == study.reference_lr else ""
        lines += [f"## lr = {lr:g}{tag}", ""]
        if sync is None:
            lines += ["(no plain k=0 run at this lr: no sync reference, no k*)", ""]
        else:
            lines += [
                f"sync (plain, k=0) final held-out reward: {sync:.3f}; 90 % of it: {TOLERANCE * sync:.3f}",
                "",
            ]
        lags = sorted({c.lag for c in cells if c.lr == lr})
        methods = order({c.method for c in cells if c.lr == lr})

        def final(c: Cell | None) -> str:
            return (
                ""
                if c is None
                else f"{c.final_mean:.2f}±{c.final_std:.2f}" + (f" [{c.collapsed}]" if c.collapsed else "")
            )

        rows = []
        for m in methods:
            by_lag = {c.lag: c for c in cells if c.method == m and c.lr == lr}
            ks = k_star(cells, m, lr, sync) if sync is not None else None
            ov = _bench_ratio(bench, m, study.opob_mode) if bench else _overhead(cells, m, lr)
            rows.append([m, *(final(by_lag.get(k)) for k in lags), ks, None if ov is None else f"{ov:.2f}x"])
        lines += ["Final held-out reward, mean ± std over seeds (collapsed seeds in brackets when any):", "",
                  *table(["method", *(f"k={k}" for k in lags), "k*", "step time vs plain"], rows), ""]  # fmt: skip
        for m in methods:
            rows = [[f"{c.lag} (= {c.same_as})" if c.same_as else str(c.lag), f"{c.final_mean:.3f} ± {c.final_std:.3f}",
                     f"{c.auc_mean:.3f}", c.seeds, f"{c.ess_min:.3f}", f"{c.ess_median:.3f}", f"{c.is_weight_max:.2f}",
                     f"{c.log_ratio_max:.1f}", f"{c.kl_median:.4f}", f"{c.grad_norm_median:.3f}",
                     f"{'yes' if c.collapsed * 2 > c.seeds else 'no'} ({c.collapsed}/{c.seeds})"]
                    for c in sorted((c for c in cells if c.method == m and c.lr == lr), key=lambda c: c.lag)]  # fmt: skip
            lines += [f"### {m} (lr {lr:g}): " + ", ".join(f"{k}={v}" for k, v in METHODS[m.split("[")[0]].items()), "",
                      *table(["k", "final held-out", "mean over run", "seeds", "ESS/B min", "ESS/B median", "max w̃",
                              "max abs s", "KL med", "grad norm med", "collapsed"], rows), ""]  # fmt: skip
    return "\n".join(lines)


def plot(study: StudyConfig, runs: list[dict], path: Path) -> None:
    lr = study.reference_lr
    mine = [r for r in runs if r["config"]["lr"] == lr]
    lags = sorted({r["config"]["lag"] for r in mine})
    mode = study.opob_mode
    methods = order({label(r["config"], mode) for r in mine})
    ncol = 3
    nrow = (len(lags) + 1 + ncol - 1) // ncol
    fig, axes = subplots(nrow, ncol, figsize=(5 * ncol, 3.6 * nrow), squeeze=False)
    colors = {m: f"C{i}" for i, m in enumerate(order(set(methods) | set(METHODS)))}
    for ax, lag in zip(axes.flat, lags, strict=False):
        for m in methods:
            rs = [r for r in mine if label(r["config"], mode) == m and r["config"]["lag"] == lag]
            if not rs:
                continue
            n = min(len(r["heldout_reward"]) for r in rs)
            xs = rs[0]["eval_steps"][:n]
            mean = [st.fmean(r["heldout_reward"][i] for r in rs) for i in range(n)]
            ax.plot(xs, mean, color=colors[m], label=m, lw=1.4)
        ax.set_title(f"k = {lag}")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out reward (mean over seeds)")
        ax.grid(alpha=0.3)
    ax = axes.flat[len(lags)]
    cells = summarise(mine, mode)
    for m in methods:
        rows = sorted((c for c in cells if c.method == m), key=lambda c: c.lag)
        xs = [max(c.lag, 0.5) for c in rows]
        ax.errorbar(xs, [c.final_mean for c in rows], yerr=[c.final_std for c in rows], color=colors[m],
                    label=m, marker="o", ms=3, capsize=2)  # fmt: skip
    sync = _sync(cells, lr)
    if sync is not None:
        ax.axhline(TOLERANCE * sync, color="k", ls="--", lw=0.8, label="90% of sync")
    ax.set_xscale("log", base=2)
    ax.set_title("final held-out reward vs k (k=0 drawn at 0.5)")
    ax.set_xlabel("k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for extra in list(axes.flat)[len(lags) + 1 :]:
        extra.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"Staleness study, lr {lr:g}: held-out reward of the current policy")
    save_figure(fig, path)


def write_report(study: StudyConfig, runs: list[dict], out: Path) -> list[Path]:
    if not runs:
        raise ValueError(f"no runs in {out / 'runs.jsonl'}: run the grid first")
    out.mkdir(parents=True, exist_ok=True)
    cells = summarise(runs, study.opob_mode)
    lrs = sorted({c.lr for c in cells})
    summary = {
        "reference_lr": study.reference_lr,
        "runs": len(runs),
        "cells": [asdict(c) for c in cells],
        "k_star": {
            f"{m}@{lr:g}": k_star(cells, m, lr, s)
            for lr in lrs
            if (s := _sync(cells, lr)) is not None
            for m in order({c.method for c in cells if c.lr == lr})
        },
        "grid_step_time_vs_plain": {
            f"{m}@{lr:g}": _overhead(cells, m, lr)
            for lr in lrs
            for m in order({c.method for c in cells if c.lr == lr})
        },
    }
    paths = [out / "summary.json", out / "summary.md", out / "curves.png"]
    paths[0].write_text(json.dumps(summary, indent=1))
    bench_path = out / "steptime.json"
    bench = json.loads(bench_path.read_text()) if bench_path.exists() else None
    paths[1].write_text(markdown(study, cells, len(runs), bench))
    plot(study, runs, paths[2])
    return paths
