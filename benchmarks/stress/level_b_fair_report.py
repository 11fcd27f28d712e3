"""The lr-matched level (b) report: selection, held-out cells, the verdict per k (written by `level_b_fair report`).

Statistics: mean and sample std over the seeds a cell has; standard error of a mean = std / sqrt(n); the
standard error of a difference of two independent cells = sqrt(se_a² + se_b²) (the seeds of two methods are
separate runs, not paired draws). The best baseline at each k is the one with the highest held-out mean at its
chosen lr: that pick is made on the held-out seeds themselves, which favours the baselines, never VCPO.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness.report import save_figure, subplots, table
from benchmarks.harness.report import write as write_results
from benchmarks.harness.stats import Gap, gap_of, mean_se, pm
from benchmarks.stress.level_b_fair import (
    ABLATIONS,
    BASELINES,
    HELDOUT_SEEDS,
    LABEL,
    LAGS,
    LRS,
    PARTS,
    RECIPE_LR,
    SAME_AS_AT_K0,
    SELECT_LAG,
    SELECT_SEEDS,
    WARM_START,
    Cell,
    accuracies,
    plan,
    select_lrs,
)  # fmt: skip


def stats(accs: list[float]) -> dict:
    """n, mean, std, se and collapses of one cell (mean/std/se None where the seeds cannot give them)."""
    return mean_se(accs).row() | {"collapsed": sum(a < WARM_START for a in accs)}


def difference(a: dict, b: dict) -> tuple[float | None, float | None]:
    """a - b and its standard error (independent cells)."""
    g = gap_of(a, b)
    return g.diff, g.se


def selection(cells: dict[tuple, Cell]) -> dict:
    chosen = select_lrs(cells)
    return {
        m: {"chosen_lr": chosen[m],
            "by_lr": {f"{lr:g}": stats(accuracies(cells, m, lr, SELECT_LAG, SELECT_SEEDS)) for lr in LRS}}
        for m in BASELINES
    }  # fmt: skip


def heldout(cells: dict[tuple, Cell]) -> dict[str, dict]:
    """Every (method, lr, k) on the held-out seeds, keyed 'method|lr|k'."""
    out = {}
    for m in BASELINES + ABLATIONS:
        for lr in LRS:
            for k in LAGS:
                c = stats(accuracies(cells, m, lr, k, HELDOUT_SEEDS))
                if c["n"]:
                    out[f"{m}|{lr:g}|{k}"] = c | {"same_as": SAME_AS_AT_K0.get(m) if k == 0 else None}
    return out


def _cell(held: dict, m: str, lr: float | None, k: int) -> dict:
    return held.get(f"{m}|{lr:g}|{k}", stats([])) if lr is not None else stats([])


def summary(held: dict, chosen: dict[str, float | None]) -> dict[str, dict]:
    """Per k: the best baseline at its chosen lr against VCPO at the recipe's lr, and what each part alone does."""
    out = {}
    for k in LAGS:
        base = {m: _cell(held, m, chosen[m], k) for m in BASELINES}
        ranked = [m for m in BASELINES if base[m]["mean"] is not None]
        best = max(ranked, key=lambda m: base[m]["mean"]) if ranked else None
        b = base[best] if best else stats([])
        v = _cell(held, "vcpo", RECIPE_LR, k)
        diff, se = difference(v, b)
        s = {
            "best_baseline": best, "best_baseline_lr": chosen[best] if best else None,
            "best_baseline_mean": b["mean"], "best_baseline_se": b["se"], "best_baseline_n": b["n"],
            "vcpo_lr": RECIPE_LR, "vcpo_mean": v["mean"], "vcpo_se": v["se"], "vcpo_n": v["n"],
            "vcpo_minus_best_baseline": diff, "vcpo_minus_best_baseline_se": se,
            "complete": all(chosen[m] is not None and base[m]["n"] == len(HELDOUT_SEEDS) for m in BASELINES)
            and v["n"] == len(HELDOUT_SEEDS),
        }  # fmt: skip
        for part in ("ess_lr", "opob"):  # each part alone at the recipe's lr
            p = _cell(held, part, RECIPE_LR, k)
            s[f"{part}_mean"], s[f"{part}_se"], s[f"{part}_n"] = p["mean"], p["se"], p["n"]
            s[f"{part}_minus_best_baseline"], s[f"{part}_minus_best_baseline_se"] = difference(p, b)
            s[f"vcpo_minus_{part}"], s[f"vcpo_minus_{part}_se"] = difference(v, p)
        vb = _cell(held, "vcpo", s["best_baseline_lr"], k)  # VCPO at the best baseline's own lr
        s["vcpo_at_baseline_lr_mean"], s["vcpo_at_baseline_lr_se"] = vb["mean"], vb["se"]
        s["vcpo_at_baseline_lr_n"] = vb["n"]
        s["vcpo_at_baseline_lr_minus_best_baseline"], s["vcpo_at_baseline_lr_minus_best_baseline_se"] = (
            difference(vb, b)
        )
        out[str(k)] = s
    return out


def lr_text(lr: float) -> str:
    """5e-4, 1.5e-4, 5e-5."""
    return f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


def _seeds(n: int | None) -> str:
    """' (3/5 seeds)' for a cell that does not have every held-out seed yet, else ''."""
    return "" if n is None or n == len(HELDOUT_SEEDS) else f" ({n}/{len(HELDOUT_SEEDS)} seeds)"


def verdict(s: dict, k: str) -> str:
    """One plain sentence per k (what the numbers say, the gap in standard errors, which part carries it)."""
    if s["vcpo_minus_best_baseline"] is None:
        return f"- k={k}: not measured yet."
    d, se = s["vcpo_minus_best_baseline"], s["vcpo_minus_best_baseline_se"]
    g = Gap(d, se)  # the 2-SE rule of benchmarks/harness/stats.py: "ahead"/"behind" only when separated
    if g.separated:
        how = f"VCPO is {g.side()} by {abs(d):.2f} ± {se:.2f} ({g.z:.1f} standard errors)"
    elif se:
        how = f"VCPO is level with it: {d:+.2f} ± {se:.2f} ({g.z:.1f} standard errors; within 2 SE: not separated)"
    else:
        how = f"VCPO is level with it: {d:+.2f} (no spread yet; not separated)"
    text = (f"- k={k}: VCPO (lr {lr_text(RECIPE_LR)}) {pm(s['vcpo_mean'], s['vcpo_se'])} vs the best baseline at its "
            f"best lr, {LABEL[s['best_baseline']]} (lr {lr_text(s['best_baseline_lr'])}) "
            f"{pm(s['best_baseline_mean'], s['best_baseline_se'])}: {how}.")  # fmt: skip
    parts = []
    for part in ("ess_lr", "opob"):
        if s[f"{part}_mean"] is not None:
            parts.append(f"{LABEL[part]} {pm(s[f'{part}_mean'], s[f'{part}_se'])}{_seeds(s[f'{part}_n'])} "
                         f"({pm(s[f'{part}_minus_best_baseline'], s[f'{part}_minus_best_baseline_se'], True)} vs the baseline)")  # fmt: skip
    if parts:
        text += " Alone at the same lr: " + "; ".join(parts) + "."
    if s["vcpo_at_baseline_lr_mean"] is not None and s["best_baseline_lr"] != RECIPE_LR:
        text += (f" VCPO at the baseline's lr: {pm(s['vcpo_at_baseline_lr_mean'], s['vcpo_at_baseline_lr_se'])}"
                 f"{_seeds(s.get('vcpo_at_baseline_lr_n'))} "
                 f"({pm(s['vcpo_at_baseline_lr_minus_best_baseline'], s['vcpo_at_baseline_lr_minus_best_baseline_se'], True)}).")  # fmt: skip
    if not s["complete"]:
        text += f" (incomplete: not every cell has its {len(HELDOUT_SEEDS)} held-out seeds)"
    return text


def _fmt(c: dict) -> str:
    if not c["n"]:
        return "missing"
    txt = f"{c['mean']:.2f}" + (f" ± {c['std']:.2f}" if c["std"] is not None else "")
    txt += f" [{c['collapsed']}]" if c["collapsed"] else ""
    return txt + ("" if c["n"] == len(HELDOUT_SEEDS) else f" ({c['n']}/{len(HELDOUT_SEEDS)})")


def markdown(report: dict, missing: dict[str, list[str]]) -> str:
    chosen = {m: v["chosen_lr"] for m, v in report["selection"].items()}
    lines = [
        "# Staleness study, level (b), lr-matched: every baseline at its best lr vs VCPO, and VCPO's parts "
        "(`benchmarks/stress/level_b_fair.sh`)",
        "",
        f"{len(report['cells'])} runs. tiny_tir warm start (held-out {WARM_START}), tiny_arith, 8 prompts x 8 samples, "
        f"40 steps, every batch exactly k versions stale (`rollout.fixed_lag`), void-turn masking off. Final = "
        "held-out accuracy (100 tasks) of the final checkpoint. Each baseline's lr is chosen on seeds "
        f"{','.join(map(str, SELECT_SEEDS))} at k={SELECT_LAG} from {', '.join(map(lr_text, LRS))}; every "
        f"other number is over held-out seeds {','.join(map(str, HELDOUT_SEEDS))}. VCPO runs at the recipe's lr "
        f"{lr_text(RECIPE_LR)} (no selection). Mean ± SE here, mean ± std in the tables below; [n] = collapsed seeds (below "
        "the warm start); (n/5) = seeds run so far.",
        "",
        "## Verdict",
        "",
    ]

    def best(s: dict) -> str:
        name = (
            f"{LABEL[s['best_baseline']]} ({lr_text(s['best_baseline_lr'])}): " if s["best_baseline"] else ""
        )
        return name + pm(s["best_baseline_mean"], s["best_baseline_se"])

    def alone(s: dict, key: str) -> str:
        return pm(s[f"{key}_mean"], s[f"{key}_se"]) + _seeds(s.get(f"{key}_n") or None)

    lines += table(["k", "best baseline (its lr)", "VCPO (5e-4)", "VCPO − best baseline", "ESS lr alone (5e-4)",
                    "OPOB alone (5e-4)", "VCPO at the baseline's lr"],
                   [[k, best(s), pm(s["vcpo_mean"], s["vcpo_se"]),
                     pm(s["vcpo_minus_best_baseline"], s["vcpo_minus_best_baseline_se"], True), alone(s, "ess_lr"),
                     alone(s, "opob"), alone(s, "vcpo_at_baseline_lr")] for k, s in report["summary"].items()])  # fmt: skip
    lines += ["", *[verdict(s, k) for k, s in report["summary"].items()], ""]
    rows = []
    for m, v in report["selection"].items():
        txt = [
            _fmt(v["by_lr"][f"{lr:g}"]).replace(f"/{len(HELDOUT_SEEDS)})", f"/{len(SELECT_SEEDS)})")
            for lr in LRS
        ]
        rows.append(
            [LABEL[m], *(f"**{t}**" if chosen[m] == lr else t for t, lr in zip(txt, LRS, strict=True))]
        )
    lines += [f"## lr selection (k={SELECT_LAG}, seeds {','.join(map(str, SELECT_SEEDS))}; mean ± std; **chosen**)", "",
              *table(["method", *(f"lr {lr_text(lr)}" for lr in LRS)], rows)]  # fmt: skip
    rows = []
    for m in BASELINES + ABLATIONS:
        for lr in LRS:
            row = []
            for k in LAGS:
                c = report["heldout"].get(f"{m}|{lr:g}|{k}")
                twin = SAME_AS_AT_K0.get(m) if k == 0 else None
                row.append((f"(= {twin}) " if twin else "") + (_fmt(c) if c else "-"))
            if any(not r.endswith("-") for r in row):
                mark = (
                    " (chosen)"
                    if chosen.get(m) == lr
                    else " (recipe)"
                    if m == "vcpo" and lr == RECIPE_LR
                    else ""
                )
                rows.append([LABEL[m], f"{lr_text(lr)}{mark}", *row])
    lines += ["", "## Held-out seeds: every (method, lr) run (mean ± std over seeds)", "",
              *table(["method", "lr", *(f"k={k}" for k in LAGS)], rows)]  # fmt: skip
    by = {(c["method"], c["lr"], c["k"], c["seed"]): c for c in report["cells"]}
    seeds = SELECT_SEEDS + HELDOUT_SEEDS
    rows = [[m, lr_text(lr), k, *("" if (c := by.get((m, lr, k, s))) is None
                                  else f"{c['final_accuracy']:.2f}{'*' if c['collapsed'] else ''}" for s in seeds)]
            for m, lr, k in sorted({(c["method"], c["lr"], c["k"]) for c in report["cells"]})]  # fmt: skip
    lines += [
        "",
        "## Every run (final accuracy by seed; * = collapsed)",
        "",
        *table(["method", "lr", "k", *(f"s{s}" for s in seeds)], rows),
    ]
    lines += ["", "## Missing runs", ""]
    for part, names in missing.items():
        pending = (
            ""
            if part != "heldout" or all(chosen.values())
            else " (and the baselines whose lr is not chosen yet)"
        )
        pending += " (the verdict table's cells)" if part == "fill" else ""
        lines.append(f"- `benchmarks/stress/level_b_fair.sh {part}`: {len(names)} runs to go{pending}"
                     + (f" (first: {', '.join(names[:3])})" if names else ""))  # fmt: skip
    return "\n".join(lines) + "\n"


def write(cells: dict[tuple, Cell], out: Path, quiet: bool = False, meta: dict | None = None) -> dict:
    """level_b_fair.{json,md,png} from every finished cell (meta: the provenance block of benchmarks/harness, `run`'s
    own or, for `report`, the one the file had)."""
    sel = selection(cells)
    held = heldout(cells)
    report = {
        "design": {"lrs": list(LRS), "recipe_lr": RECIPE_LR, "lags": list(LAGS), "select_lag": SELECT_LAG,
                   "select_seeds": list(SELECT_SEEDS), "heldout_seeds": list(HELDOUT_SEEDS),
                   "warm_start": WARM_START, "same_as_at_k0": SAME_AS_AT_K0, "steps": 40},
        "cells": [c.row() for _, c in sorted(cells.items())],
        "selection": sel,
        "heldout": held,
        "summary": summary(held, {m: v["chosen_lr"] for m, v in sel.items()}),
    }  # fmt: skip
    report["missing"] = {part: [p.name for p in plan(part, cells)] for part in PARTS}
    if meta is not None:
        report["meta"] = meta
    write_results(out.stem, report, out.parent, lambda r: markdown(r, r["missing"]), quiet)
    _plot(report, out.with_suffix(".png"))
    return report


def _plot(report: dict, png: Path) -> None:
    """Final accuracy against lr, one panel per k (held-out seeds, mean ± SE), plus the selection panel."""
    fig, axes = subplots(1, len(LAGS) + 1, figsize=(4.4 * (len(LAGS) + 1), 3.6), sharey=True)
    methods = BASELINES + ABLATIONS
    for ax, k in zip(axes[1:], LAGS, strict=True):
        for i, m in enumerate(methods):
            pts = [(lr, c) for lr in LRS if (c := report["heldout"].get(f"{m}|{lr:g}|{k}"))]
            if pts:
                ax.errorbar([lr for lr, _ in pts], [c["mean"] for _, c in pts], [c["se"] or 0 for _, c in pts],
                            marker="o", color=f"C{i}", label=LABEL[m], capsize=2,
                            linestyle="-" if m in ABLATIONS else ":")  # fmt: skip
        ax.set_title(f"held-out seeds, k = {k}")
    for i, m in enumerate(BASELINES):
        by = report["selection"][m]["by_lr"]
        pts = [(lr, by[f"{lr:g}"]) for lr in LRS if by[f"{lr:g}"]["n"]]
        if pts:
            axes[0].errorbar([lr for lr, _ in pts], [c["mean"] for _, c in pts], [c["se"] or 0 for _, c in pts],
                             marker="o", color=f"C{i}", label=LABEL[m], capsize=2, linestyle=":")  # fmt: skip
    axes[0].set_title(f"lr selection, k = {SELECT_LAG}, seeds 0-2")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.axhline(WARM_START, color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylabel("final held-out accuracy (mean ± SE)")
    if axes[-1].get_legend_handles_labels()[0]:
        axes[-1].legend(fontsize=7)
    save_figure(fig, png)
