"""The k-sweep's report: calibration, lr selection, per (method, k) final ± SE, collapse rate, AUC, ESS, the verdict.

Written by `python -m benchmarks.stress.k_sweep report` (and by `run` as runs finish) to
benchmarks/results/stress/k_sweep.{json,md,png}.

Statistics: mean and sample std over the held-out seeds a cell has; SE = std / sqrt(n); the SE of a difference
of two cells = sqrt(se_a² + se_b²) (separate runs, not paired draws); all of it, and the 2-SE rule (a gap is
"separated" at 2 SE of the difference or more), is benchmarks/harness/stats.py. The verdict at each k names the
method with the highest held-out mean final (each at its own chosen lr), its lead over the second and, where VCPO
is not that method, VCPO's gap to it; VCPO is "ahead" or "behind" only when that gap is separated, "level"
otherwise; the lags where VCPO is behind come first. The sentences are built from the summary fields in k_sweep.json, and
`verdict_lines` is the one function that words them (the test re-derives them from the file).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.harness.report import save_figure, subplots, table
from benchmarks.harness.report import write as write_results
from benchmarks.harness.stats import SEPARATED_AT_SE, gap_of, mean_se, pm
from benchmarks.stress import k_sweep as ks
from benchmarks.stress.level_b_fair import LABEL
from benchmarks.stress.level_b_fair_report import lr_text

SEPARATION = (
    SEPARATED_AT_SE  # a lead counts as separated at this many standard errors of the difference or more
)
COMMAND = "nice -n 15 .venv/bin/python -m benchmarks.stress.k_sweep run"


def cell_stats(runs: list[ks.Cell]) -> dict:
    """final (mean/std/se), collapses, AUC and mean ESS/B of one (method, lr, k) over its runs."""
    ess = [c.ess_mean for c in runs if c.ess_mean is not None]
    return mean_se([c.final_accuracy for c in runs]).row() | {
        "collapsed": sum(c.collapsed for c in runs),
        "auc": mean_se([c.auc for c in runs]).row(),
        "ess_mean": statistics.mean(ess) if ess else None,
    }


def heldout(cells: dict[tuple, ks.Cell], chosen: dict[str, float | None]) -> dict[str, dict[str, dict]]:
    """method -> k -> stats, each method at its chosen lr on the held-out seeds."""
    return {
        m: {str(k): cell_stats(ks.finals(cells, m, lr, k, ks.HELDOUT_SEEDS)) for k in ks.LAGS}
        for m, lr in chosen.items() if lr is not None
    }  # fmt: skip


def summary(held: dict[str, dict[str, dict]], chosen: dict[str, float | None]) -> dict[str, dict]:
    """Per k: the best method, its lead over the second, VCPO against the best."""
    out = {}
    n = len(ks.HELDOUT_SEEDS)
    for k in map(str, ks.LAGS):
        # only cells with every held-out seed in are ranked: a partial cell's mean moves when its last seeds
        # land; it shows in the table with its count and in the verdict as not ranked yet
        measured = [m for m in ks.METHODS if m in held and held[m][k]["n"] == n]
        partial = {m: held[m][k]["n"] for m in ks.METHODS if m in held and 0 < held[m][k]["n"] < n}
        # at k = 0 several methods can be the same runs (plain's or VCPO's at one lr): rank each set of runs once,
        # under the method whose runs they are if it chose that lr, else the first of METHODS that did
        runs_of: dict[tuple, str] = {}
        for m in sorted(measured, key=lambda m: ks.twin(m, int(k)) != m):
            runs_of.setdefault((ks.twin(m, int(k)), chosen[m]), m)
        ranked = sorted(runs_of.values(), key=lambda m: -held[m][k]["mean"])
        s: dict = {"methods": len(measured),
                   "complete": len(measured) == len(ks.METHODS),
                   "collapsed": {m: held[m][k]["collapsed"] for m in ranked},
                   "runs": {m: held[m][k]["n"] for m in ranked}, "partial": partial}  # fmt: skip
        if ranked:
            best = ranked[0]
            b = held[best][k]
            s |= {"best": best, "best_lr": chosen[best], "best_mean": b["mean"], "best_se": b["se"]}
            if len(ranked) > 1:
                second = ranked[1]
                g = gap_of(b, held[second][k])
                lead, lead_se = g.diff, g.se
                s |= {"second": second, "second_lr": chosen[second], "second_mean": held[second][k]["mean"],
                      "second_se": held[second][k]["se"], "lead": lead, "lead_se": lead_se,
                      "lead_separated": g.separated}  # fmt: skip
            if "vcpo" in ranked:
                v = held["vcpo"][k]
                g = gap_of(v, b)
                # VCPO's side by the 2-SE rule: ahead only when it is the best AND its lead over the second is
                # separated; behind only when its gap to the best is separated; level otherwise
                side = (("ahead" if s.get("lead_separated") else "level") if best == "vcpo"
                        else "behind" if g.separated else "level")  # fmt: skip
                s |= {"vcpo_best": best == "vcpo", "vcpo_side": side, "vcpo_lr": chosen["vcpo"],
                      "vcpo_mean": v["mean"], "vcpo_se": v["se"], "vcpo_minus_best": g.diff,
                      "vcpo_minus_best_se": g.se, "vcpo_gap_separated": g.separated}  # fmt: skip
        out[k] = s
    return out


def vcpo_against(held: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """method -> k -> VCPO's mean final minus the method's, the SE of that difference and whether it is separated,
    and the same for the area under the curve (`auc`): VCPO against every method, not only the verdict's best,
    where both cells have every held-out seed."""
    n = len(ks.HELDOUT_SEEDS)
    if "vcpo" not in held:
        return {}
    v = held["vcpo"]
    out: dict[str, dict[str, dict]] = {}
    for m in ks.METHODS:
        if m != "vcpo" and m in held:
            out[m] = {}
            for k in map(str, ks.LAGS):
                if v[k]["n"] == n and held[m][k]["n"] == n:
                    f, a = gap_of(v[k], held[m][k]), gap_of(v[k]["auc"], held[m][k]["auc"])
                    out[m][k] = {"difference": f.diff, "se": f.se, "separated": f.separated,
                                 "auc": {"difference": a.diff, "se": a.se, "separated": a.separated}}  # fmt: skip
    return out


def _side(c: dict) -> str:
    """Where VCPO stands against a method in one `vcpo_vs` entry: 'ahead' or 'behind' at SEPARATION SE or more of the
    difference, else 'level'."""
    return ("ahead" if c["difference"] > 0 else "behind") if c["separated"] else "level"


def _spread(c: dict) -> str:
    """'3.4 SE': the difference in standard errors of it ('' without a spread)."""
    return f"{abs(c['difference']) / c['se']:.1f} SE" if c["se"] else ""


def _against(c: dict | None) -> str:
    """'+0.06 ± 0.02 (3.4 SE; ahead)': VCPO minus the method; 'ahead'/'behind' only at SEPARATION SE or more."""
    if c is None:
        return "-"
    word = {"level": "not separated"}.get(_side(c), _side(c))
    return f"{pm(c['difference'], c['se'], signed=True)} ({_spread(c)}{'; ' if c['se'] else ''}{word})"


def vcpo_vs_lines(vs: dict[str, dict[str, dict]]) -> list[str]:
    """One sentence per k where VCPO has been set against some method: the methods it is behind first, then
    those it is level with (within SEPARATION SE), then those it is ahead of; lags where it is behind any first."""
    lines: list[tuple[int, int, str]] = []
    for k in map(str, ks.LAGS):
        against = {m: by_k[k] for m, by_k in vs.items() if k in by_k}
        if not against:
            continue
        groups: dict[str, list[str]] = {"behind": [], "level": [], "ahead": []}
        for m, c in against.items():
            spread = f", {_spread(c)}" if c["se"] else ""
            groups[_side(c)].append(f"{LABEL[m]} ({pm(c['difference'], c['se'], signed=True)}{spread})")
        words = {"behind": "behind", "level": "level with", "ahead": "ahead of"}
        text = "; ".join(f"{words[side]} {', '.join(ms)}" for side, ms in groups.items() if ms)
        lines.append((0 if groups["behind"] else 1, int(k), f"- k={k}: VCPO is {text}."))
    return [text for *_, text in sorted(lines)]


def _gap_text(d: float, se: float | None, sep: bool | None) -> str:
    """'0.05 ± 0.02 (2.5 SE; separated)', or without a spread yet '0.05 (no spread yet)'."""
    if se is None:
        return f"{abs(d):.2f} (no spread yet; not separated)"
    if se == 0:
        return f"{abs(d):.2f} (no spread; {'separated' if sep else 'not separated'})"
    return f"{abs(d):.2f} ± {se:.2f} ({abs(d) / se:.1f} SE; {'separated' if sep else 'not separated'})"


def _who(s: dict, role: str) -> str:
    return f"{LABEL[s[role]]} (lr {lr_text(s[f'{role}_lr'])}) {pm(s[f'{role}_mean'], s[f'{role}_se'])}"


def _under_way(s: dict) -> str:
    """'TIS (seq) 2/5, ...': the cells that have some of their held-out seeds, not all."""
    return ", ".join(f"{LABEL[m]} {c}/{len(ks.HELDOUT_SEEDS)}" for m, c in s["partial"].items())


def verdict_line(k: str, s: dict) -> str:
    """One sentence per k, from the summary fields only; its first words follow the 2-SE rule (`vcpo_side`): a
    highest mean within 2 SE of the next is "level", never "ahead"."""
    if not s.get("best"):
        return f"- k={k}: not measured yet." + (f" Under way: {_under_way(s)}." if s.get("partial") else "")
    vcpo = f"VCPO (lr {lr_text(s['vcpo_lr'])}) {pm(s['vcpo_mean'], s['vcpo_se'])}" if "vcpo_side" in s else ""
    if "vcpo_side" not in s:
        text = f"- k={k}: VCPO not measured yet. Best so far: {_who(s, 'best')}."
    elif s["vcpo_best"] and "second" not in s:
        text = f"- k={k}: VCPO is the only method measured: {_who(s, 'best')}."
    elif s["vcpo_best"]:
        gap = _gap_text(s["lead"], s["lead_se"], s["lead_separated"])
        text = (f"- k={k}: VCPO is ahead: {vcpo} leads {_who(s, 'second')} by {gap}." if s["vcpo_side"] == "ahead"
                else f"- k={k}: VCPO is level with {LABEL[s['second']]}: {vcpo} has the highest mean, above "
                f"{_who(s, 'second')} by {gap}.")  # fmt: skip
    else:
        gap = _gap_text(s["vcpo_minus_best"], s["vcpo_minus_best_se"], s["vcpo_gap_separated"])
        text = (f"- k={k}: VCPO is behind {LABEL[s['best']]}: {vcpo} is below {_who(s, 'best')} by {gap}."
                if s["vcpo_side"] == "behind" else
                f"- k={k}: VCPO is level with {LABEL[s['best']]}: {vcpo} is below {_who(s, 'best')} by {gap}.")  # fmt: skip
        if s["second"] != "vcpo":
            text += (f" The best leads the second, {_who(s, 'second')}, by "
                     f"{_gap_text(s['lead'], s['lead_se'], s['lead_separated'])}.")  # fmt: skip
    col = [f"{LABEL[m]} {c}/{s['runs'][m]}" for m, c in s["collapsed"].items() if c]
    text += f" Collapsed: {', '.join(col)}." if col else " No run collapsed."
    if s.get("partial"):
        text += f" Not ranked until all their seeds are in: {_under_way(s)}."
    if not s["complete"]:
        text += f" (incomplete: {s['methods']} of {len(ks.METHODS)} methods, {sum(s['runs'].values())} runs)"
    return text


def verdict_lines(summ: dict[str, dict]) -> list[str]:
    """The verdict, lags where VCPO is behind first, then level, then ahead, then unmeasured, each in k order."""

    def order(k: str) -> int:
        s = summ[k]
        return 3 if not s.get("best") else {"behind": 0, "level": 1, "ahead": 2}.get(s.get("vcpo_side"), 0)

    return [verdict_line(k, summ[k]) for k in sorted(summ, key=lambda k: (order(k), int(k)))]


def calibration(cells: dict[tuple, ks.Cell], chosen: dict[str, float | None]) -> list[dict]:
    """Synchronous RL from the warm start: the calibration runs (seed 0), then each method's k=0 held-out runs at
    its chosen lr, as the mean held-out accuracy at each policy version (the same versions in every k=0 run)."""
    rows = []
    for m, lr, seed in ks.CALIBRATE:
        if (c := cells.get((m, lr, 0, seed))) is not None:
            rows.append({"method": m, "lr": lr, "seeds": [seed], "curve": [list(p) for p in c.curve]})
    seen = set()
    for m, lr in chosen.items():
        runs = ks.finals(cells, m, lr, 0, ks.HELDOUT_SEEDS) if lr is not None else []
        if not runs or (ks.twin(m, 0), lr) in seen:
            continue
        seen.add((ks.twin(m, 0), lr))
        versions = sorted(set.intersection(*(set(dict(c.curve)) for c in runs)))
        curve = [[v, statistics.mean(dict(c.curve)[v] for c in runs)] for v in versions]
        rows.append({"method": ks.twin(m, 0), "lr": lr, "seeds": [c.seed for c in runs], "curve": curve})
    return rows


def grid_edge(lr: float | None, ran: tuple[float, ...]) -> str | None:
    """'lowest'/'highest' when a chosen lr is the end of the lrs that ran (the grid reached its bound, or the runs
    past the end are still to come): the method's best lr may lie beyond it."""
    return None if lr is None else "lowest" if lr == ran[0] else "highest" if lr == ran[-1] else None


def selection(cells: dict[tuple, ks.Cell]) -> dict:
    out = {}
    for m in ks.METHODS:
        sel = ks.select(cells, m)
        out[m] = {"chosen_lr": sel.chosen, "done": sel.done, "grid": list(sel.grid),
                  "grid_edge": grid_edge(sel.chosen, sel.ran),
                  "by_lr": {f"{lr:g}": cell_stats(ks.finals(cells, m, lr, ks.SELECT_LAG, ks.SELECT_SEEDS))
                            for lr in sel.grid}}  # fmt: skip
    return out


def edge_lines(sel: dict) -> list[str]:
    """One line per grid end and lr that some method's chosen lr sits at (none when every choice is inside its
    grid)."""
    lines = []
    for edge, beyond in (("lowest", "below"), ("highest", "above")):
        at = sorted({v["chosen_lr"] for v in sel.values() if v["grid_edge"] == edge})
        for lr in at:
            names = [LABEL[m] for m, v in sel.items() if v["grid_edge"] == edge and v["chosen_lr"] == lr]
            lines.append(f"Chosen at the grid's {edge} lr ({lr_text(lr)}): {', '.join(names)}; their best lr may lie "
                         f"{beyond} the grid (`LRS`, `LR_BOUNDS` in benchmarks/stress/k_sweep.py).")  # fmt: skip
    return lines


def _fmt(c: dict, n: int) -> str:
    if not c["n"]:
        return "-"
    txt = pm(c["mean"], c["se"]) + (f" [{c['collapsed']}]" if c["collapsed"] else "")
    return txt + ("" if c["n"] == n else f" ({c['n']}/{n})")


def _warm(d: dict) -> str:
    if d["warm_start"] is None:
        return "not built yet: no run can start"
    return str(ks.WarmStart(d["warm_start"], d.get("warm_sha256")))


def unkept_warm_start(report: dict) -> bool:
    """Whether the report's runs started from a warm start that was not kept (the first sweep's, from before runs
    recorded its fingerprint): no run can be added to them."""
    return bool(report["cells"]) and report["design"].get("warm_sha256") is None


def _heldout_runs(methods: int) -> int:
    """Held-out runs of `methods` methods at every k (an upper bound: at k = 0 some are another method's runs)."""
    return methods * len(ks.LAGS) * len(ks.HELDOUT_SEEDS)


def missing_heldout(planned: list[ks.Planned]) -> dict[str, dict[str, list[int]]]:
    """k -> method -> the held-out seeds still to run (at k = 0 under the method whose run it is)."""
    out: dict[str, dict[str, list[int]]] = {}
    for p in planned:
        out.setdefault(str(p.k), {}).setdefault(p.method, []).append(p.seed)
    return out


def missing_cell_lines(miss: dict[str, dict[str, list[int]]]) -> list[str]:
    """One line per k with held-out runs to go: which methods, which seeds."""
    lines = []
    for k, by in miss.items():
        seeds = {tuple(v) for v in by.values()}
        if set(by) == set(ks.METHODS) and len(seeds) == 1:
            what = f"every method, seeds {','.join(map(str, seeds.pop()))}"
        else:
            what = "; ".join(f"{LABEL[m]} seeds {','.join(map(str, v))}" for m, v in by.items())
        lines.append(f"  - k={k}: {what} ({sum(map(len, by.values()))} runs)")
    return lines


def markdown(report: dict) -> str:
    d = report["design"]
    chosen = {m: v["chosen_lr"] for m, v in report["selection"].items()}
    n_held, n_sel = len(ks.HELDOUT_SEEDS), len(ks.SELECT_SEEDS)
    lines = [
        "# Staleness study, level (b), the k-sweep: every method at its best lr, k up to 64 (`benchmarks.stress.k_sweep`)",
        "",
        f"{'The first sweep: its warm start was not kept, so no run can be added to it. ' if unkept_warm_start(report) else ''}"
        f"{len(report['cells'])} runs. Task: tiny_multistep (`envs/tiny_multistep.yaml`: one affine step applied 2-3 "
        f"times, one tool call per application), warm start ({_warm(d)}), "
        f"{d['steps']} steps of 8 prompts x 8 samples, batch b sampled by policy version max(0, b-k) "
        "(`rollout.fixed_lag`: exactly k versions stale from step k on, the first k batches all sampled by the warm "
        f"start; at k={max(ks.LAGS)}, {max(ks.LAGS)} of the {d['steps']}), "
        f"void masking off. Each method's lr is chosen on seeds {','.join(map(str, ks.SELECT_SEEDS))} at k={ks.SELECT_LAG} "
        f"from {', '.join(map(lr_text, ks.LRS))} (where the best is the grid's lowest or highest lr, the grid grows "
        f"by halves or doubles, within {lr_text(ks.LR_BOUNDS[0])}-{lr_text(ks.LR_BOUNDS[1])}, until it lies inside); "
        "every other number is over held-out seeds "
        f"{','.join(map(str, ks.HELDOUT_SEEDS))}, each method at its chosen lr. Final = held-out accuracy (100 tasks, "
        "T=1) of the final checkpoint; collapsed = final below the warm start; AUC = mean held-out accuracy over the "
        f"run's policy versions 0..{d['steps']} (trapezoids between evals every {d['eval_every']} steps, which under a "
        "fixed lag measure the policy k versions back, and the final); ESS = mean ESS/B over trained steps. "
        "Mean ± SE; [n] = collapsed runs; (n/5) = runs so far. At k=0 tis/mis/m2po/ESS-lr are plain's runs and "
        "OPOB alone is VCPO's, at the method's own lr.",
        "",
        "## Verdict",
        "",
        *verdict_lines(report["summary"]),
        "",
        "## Final held-out accuracy (mean ± SE [collapsed])",
        "",
    ]
    held = report["heldout"]
    by_k = [f"k={k}" for k in ks.LAGS]
    lines += table(["method (lr)", *by_k], [[f"{LABEL[m]} ({lr_text(chosen[m])})",
                   *(_fmt(held[m][str(k)], n_held) for k in ks.LAGS)] for m in ks.METHODS if m in held])  # fmt: skip

    def use(c: dict) -> str:
        if not c["n"]:
            return "-"
        if c["ess_mean"] is None:
            return f"{c['collapsed']}/{c['n']}"
        return f"{c['collapsed']}/{c['n']}; {pm(c['auc']['mean'], c['auc']['se'])}; {c['ess_mean']:.2f}"

    lines += ["", "## Collapse rate, AUC (mean ± SE), mean ESS/B", "",
              *table(["method", *by_k], [[LABEL[m], *(use(held[m][str(k)]) for k in ks.LAGS)]
                                         for m in ks.METHODS if m in held])]  # fmt: skip
    lines += ["", f"## VCPO against each method (final: VCPO minus the method, ± SE of the difference; ahead or "
              f"behind at {SEPARATION:g} SE or more; where both have all {n_held} held-out seeds)"]  # fmt: skip
    tables = {"final": ("", lambda c: c), "auc": (
        "The same for the area under the curve (how soon a method gets to its level, not only where it ends):",
        lambda c: c["auc"])}  # fmt: skip
    for name, (intro, pick) in tables.items():
        rows = [[LABEL[m], *(_against(pick(vs[str(k)])) if str(k) in vs else "-" for k in ks.LAGS)]
                for m, vs in report.get("vcpo_vs", {}).items()]  # fmt: skip
        head = "VCPO minus" + (" (AUC)" if name == "auc" else "")
        lines += ["", *([intro, ""] if intro else []), *table([head, *by_k], rows)]
    lrs = sorted({float(lr) for v in report["selection"].values() for lr in v.get("grid", ks.LRS)})
    rows = []
    for m, v in report["selection"].items():
        row = [_fmt(v["by_lr"].get(f"{lr:g}", {"n": 0}), n_sel) for lr in lrs]
        rows.append(
            [LABEL[m], *(f"**{t}**" if chosen[m] == lr else t for t, lr in zip(row, lrs, strict=True))]
        )
    lines += ["", f"## lr selection (k={ks.SELECT_LAG}, seeds {','.join(map(str, ks.SELECT_SEEDS))}; mean ± SE "
              "[collapsed]; **chosen**)", "", *table(["method", *(f"lr {lr_text(lr)}" for lr in lrs)], rows)]  # fmt: skip
    if edges := edge_lines(report["selection"]):
        lines += ["", *edges]
    if cal := report["calibration"]:
        versions = sorted({v for r in cal for v, _ in r["curve"]})
        by = [dict((int(v), a) for v, a in r["curve"]) for r in cal]
        lines += ["", "## Calibration: synchronous RL (k=0) from the warm start, held-out accuracy by step (mean "
                  "over seeds)", "", *table(["method", "lr", "seeds", *(f"step {v}" for v in versions)], [
                      [LABEL[r["method"]], lr_text(r["lr"]), ",".join(map(str, r["seeds"])),
                       *(f"{b[v]:.2f}" if v in b else "" for v in versions)] for r, b in zip(cal, by, strict=True)])]  # fmt: skip
    lines += ["", "## Missing runs", ""]
    miss = report["missing"]
    total = sum(len(v) for v in miss.values())
    unchosen = [m for m, lr in chosen.items() if lr is None]
    for part, names in miss.items():
        later = ""
        if part == "heldout" and unchosen:  # planned only once a method's selection is complete
            later = (f" planned so far, and up to {_heldout_runs(len(unchosen))} more once the lr of "
                     f"{', '.join(LABEL[m] for m in unchosen)} is chosen")  # fmt: skip
        lines.append(
            f"- {part}: {len(names)} runs to go{later}"
            + (f" (first: {', '.join(names[:3])})" if names else "")
        )
        if part == "heldout":
            lines += missing_cell_lines(report["missing_heldout"])
    if total or unchosen:
        later = " (and the held-out runs above, once the lrs are chosen)" if unchosen else ""
        if unkept_warm_start(report):
            lines += ["", f"{total} runs missing{later}. They cannot be added to these runs: the warm start these "
                      "runs started from was not kept (built on another machine; one rebuilt on another CPU "
                      f"differs), and `run` adds no runs from another one. `{COMMAND}` runs the sweep from the "
                      f"kept warm start ({ks.OUT})."]  # fmt: skip
        else:
            lines += ["", f"{total} runs missing{later}; `{COMMAND}` finishes them (finished runs are skipped, "
                      "and the held-out runs of a method start once its selection is complete)."]  # fmt: skip
    else:
        lines += ["", "None: the sweep is complete."]
    return "\n".join(lines) + "\n"


def write(
    cells: dict[tuple, ks.Cell],
    out: Path,
    quiet: bool = False,
    warm: ks.WarmStart | None = None,
    meta: dict | None = None,
) -> dict:
    """k_sweep.{json,md,png} beside `out` from every finished cell (warm: the sweep's warm start, for its numbers
    before any run has finished; meta: the provenance block of benchmarks/harness, `run`'s own or, for `report`,
    the one the file already had)."""
    accs = {c.warm for c in cells.values()}
    shas = {c.warm_sha256 for c in cells.values()} - {None}
    if len(accs) > 1 or len(shas) > 1:
        starts = sorted({str(c.warm_start) for c in cells.values()})
        raise ValueError(
            f"k_sweep: runs from different warm starts ({'; '.join(starts)}): one sweep, one warm start"
        )
    if cells:
        warm = ks.WarmStart(accs.pop(), shas.pop() if shas else None)
    sel = selection(cells)
    chosen = {m: v["chosen_lr"] for m, v in sel.items()}
    held = heldout(cells, chosen)
    todo = {part: ks.plan(part, cells) for part in ks.PARTS}
    report = {
        "design": {"task": "envs/tiny_multistep.yaml", "recipe": ks.RECIPE,
                   "warm_start": warm.accuracy if warm else None, "warm_sha256": warm.sha256 if warm else None,
                   "methods": list(ks.METHODS), "lrs": list(ks.LRS), "lags": list(ks.LAGS),
                   "select_lag": ks.SELECT_LAG, "select_seeds": list(ks.SELECT_SEEDS),
                   "heldout_seeds": list(ks.HELDOUT_SEEDS), "steps": ks.STEPS, "eval_every": ks.EVAL_EVERY,
                   "separation_se": SEPARATION},
        "cells": [c.row() for _, c in sorted(cells.items())],
        "calibration": calibration(cells, chosen),
        "selection": sel,
        "heldout": held,
        "summary": summary(held, chosen),
        "vcpo_vs": vcpo_against(held),
        "missing": {part: [p.name for p in runs] for part, runs in todo.items()},
        "missing_heldout": missing_heldout(todo["heldout"]),
    }  # fmt: skip
    if meta is not None:
        report["meta"] = meta
    write_results(out.stem, report, out.parent, markdown, quiet)
    _plot(report, out.with_suffix(".png"))
    return report


def _plot(report: dict, png: Path) -> None:
    """Final accuracy vs k with SE bands (collapses marked x, with their count), AUC vs k, ESS vs k."""
    fig, axes = subplots(1, 3, figsize=(15, 4.2))
    pos = {k: i for i, k in enumerate(ks.LAGS)}  # k evenly spaced: 0, 4, ..., 64
    held = report["heldout"]
    for i, m in enumerate(ks.METHODS):
        if m not in held:
            continue
        ls = "-" if m in ("vcpo", "opob", "ess_lr") else ":"
        pts = [(k, held[m][str(k)]) for k in ks.LAGS if held[m][str(k)]["n"]]
        if not pts:
            continue
        x = [pos[k] for k, _ in pts]
        for ax, get in (
            (axes[0], lambda c: (c["mean"], c["se"])),
            (axes[1], lambda c: (c["auc"]["mean"], c["auc"]["se"])),
        ):
            mean = [get(c)[0] for _, c in pts]
            se = [get(c)[1] or 0 for _, c in pts]
            ax.plot(x, mean, ls, marker="o", color=f"C{i}", label=LABEL[m], lw=2 if m == "vcpo" else 1.2)
            ax.fill_between(x, [a - b for a, b in zip(mean, se, strict=True)],
                            [a + b for a, b in zip(mean, se, strict=True)], color=f"C{i}", alpha=0.15)  # fmt: skip
        for (_k, c), xi in zip(pts, x, strict=True):
            if c["collapsed"]:
                axes[0].scatter([xi], [c["mean"]], marker="x", s=80, color=f"C{i}", zorder=5)
                axes[0].annotate(str(c["collapsed"]), (xi, c["mean"]), textcoords="offset points", xytext=(5, 3),
                                 fontsize=7, color=f"C{i}")  # fmt: skip
        ess = [(pos[k], c["ess_mean"]) for k, c in pts if c["ess_mean"] is not None]
        if ess:
            axes[2].plot(
                [a for a, _ in ess], [b for _, b in ess], ls, marker="o", color=f"C{i}", label=LABEL[m]
            )
    warm = report["design"]["warm_start"]
    for ax, title in zip(axes, ("final held-out accuracy (mean ± SE; x = collapsed runs)",
                                "area under the accuracy curve (mean ± SE)", "mean ESS/B over training"), strict=True):  # fmt: skip
        ax.set_xticks(range(len(ks.LAGS)), [str(k) for k in ks.LAGS])
        ax.set_xlabel("staleness k (versions)")
        ax.set_title(title, fontsize=9)
    for ax in axes[:2]:
        if warm is not None:
            ax.axhline(warm, color="grey", linestyle=":", linewidth=1)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    save_figure(fig, png)
