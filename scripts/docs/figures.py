"""Figures the README and the site state, written from benchmarks/results/*.json (never typed by hand).

Each function reads one results file and returns Markdown. The README's and the pages' generated blocks
(`<!-- BEGIN generated: NAME -->`, written by scripts/docs/generate.py) call these functions, so a figure on the front page, on its page and in its file cannot differ. A comparison is called
"ahead" or "behind" only when the gap is at least 2 standard errors; otherwise "not separated" (the 2-SE rule of
benchmarks/harness/stats.py, the one statistics module).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from benchmarks.harness.stats import SEPARATED_AT_SE, Gap, mean_se
from benchmarks.stress.level_b_fair_report import lr_text
from benchmarks.vs_trl_report import cell_name

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


@cache
def load(name: str) -> dict:
    """A results file by its path under benchmarks/results/ (e.g. 'stress/level_b_fair.json')."""
    return json.loads((RESULTS / name).read_text())


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
        return Gap(self.diff, self.se).side()

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


K_SWEEP_SECTION = "the-k-sweep-k-up-to-64-on-a-task-the-toy-does-not-saturate"  # its heading's anchor


def k_sweep_verdict() -> str:
    """The k-sweep's verdict at every k measured so far, worded by the sweep's own report
    (`k_sweep_report.verdict_lines`, `vcpo_vs_lines`), and how much of it is still to run: the second sweep
    (benchmarks/results/stress/k_sweep2.json, from the warm start the repository keeps), the first one named after
    it. On the study's page, above the sweep's section."""
    first = load("stress/k_sweep.json")
    return "\n".join(
        [
            *_k_sweep_lines(load("stress/k_sweep2.json")),
            "",
            f"A first sweep ({len(first['cells'])} runs, `benchmarks/results/stress/k_sweep.md`) started from a "
            "warm start that was not kept, so its runs can neither be completed nor set beside these; it is not "
            "continued.",
        ]
    )


def _k_sweep_lines(report: dict) -> list[str]:
    """One sweep's verdict, where VCPO is not ahead first: the best method per k, then VCPO against each method."""
    from benchmarks.stress.k_sweep_report import edge_lines, unkept_warm_start, vcpo_vs_lines, verdict_lines
    from benchmarks.stress.level_b_fair import LABEL

    d = report["design"]
    measured = [line for line in verdict_lines(report["summary"]) if not line.endswith("not measured yet.")]
    unmeasured = [k for k, s in report["summary"].items() if not s.get("best") and not s.get("partial")]
    left = sum(len(names) for names in report["missing"].values())
    unchosen = [LABEL[m] for m, v in report["selection"].items() if v["chosen_lr"] is None]
    chosen = [
        f"{LABEL[m]} {lr_text(v['chosen_lr'])}" for m, v in report["selection"].items() if v["chosen_lr"]
    ]
    later = f", and the held-out runs of {', '.join(unchosen)} once their lr is chosen" if unchosen else ""
    if unkept_warm_start(report) and (left or unchosen):
        status = (f"{len(report['cells'])} runs; {left} planned runs{later}{',' if later else ''} cannot be "
                  "added: the warm start these started from was not kept")  # fmt: skip
    elif left or unchosen:
        status = f"{len(report['cells'])} runs so far, {left} planned still to run{later}"
    else:
        status = f"{len(report['cells'])} runs, the sweep complete"
    lines = [
        f"The k-sweep, on a task of 2-3 tool calls per problem (tiny_multistep, toy model, {d['steps']} steps), k up "
        f"to {max(d['lags'])}; each method at the lr it did best with at k={d['select_lag']} "
        f"({', '.join(chosen)}), final held-out accuracy over seeds {', '.join(map(str, d['heldout_seeds']))} "
        f"({status}):",
        "",
        *measured,
    ]
    if unmeasured:
        lines.append(f"- not measured yet: k={', '.join(sorted(unmeasured, key=int))}.")
    if against := vcpo_vs_lines(report.get("vcpo_vs", {})):
        lines += ["", f"VCPO against each method, where both have all {len(d['heldout_seeds'])} held-out seeds "
                  f"(VCPO minus the method ± SE of the difference; ahead or behind at {d['separation_se']:g} SE or more, "
                  "level within):", "", *against]  # fmt: skip
    if edges := edge_lines(report["selection"]):
        lines += ["", *edges]
    return lines


def _ratio(x: float) -> str:
    return f"{x:.2f}×"


def _sooner(x: float) -> str:
    """A time-to-target ratio in the direction it points: "1.40× sooner", or "1.45× later (0.69× sooner)"."""
    return f"**{_ratio(x)} sooner**" if x >= 1 else f"**{_ratio(1 / x)} later** ({_ratio(x)} sooner)"


def _vs_trl_tuned(s: dict) -> bool:
    """Whether the vs_trl results carry a tuning pass of the invocation that measured."""
    return s["tuning"].get("steps", 0) > 0 and bool(s["tuning"].get("same_invocation"))


def vs_trl_headline() -> str:
    """agent-rl async against the TRL cell that reached the target soonest, cores busy beside each figure."""
    s = load("vs_trl.json")
    h = s["summary"].get("headline")
    if not h:  # a results file from before the tuned, three-TRL-cell benchmark
        return (
            f"no headline: `benchmarks/results/vs_trl.json` ({s['date']}) predates the tuned comparison "
            "against TRL's fastest cell; run `make bench-trl`."
        )
    k = s["k_async_fixed_before_runs"]
    d, busy, trl = h[f"agent-rl k={k}"], h["cores_busy"], h["against"]
    untuned = (
        ""
        if _vs_trl_tuned(s)
        else "**not yet the fair measurement**: the recorded run had no tuning pass in its invocation (each system "
        "at a configuration from an earlier pass) and no TRL cell with a constant lr; from its runs, "
    )
    return (
        f"{untuned}agent-rl k={k} (cores busy {busy[f'agent-rl k={k}']:.2f}) reaches {h['target']} "
        f"{_sooner(d['speedup_train'])} in training time than TRL's fastest cell to it "
        f"({trl.removeprefix('trl ')}: {h['against_config']}, cores busy {busy[trl]:.2f}); "
        f"{_ratio(d['speedup_process'])} in whole-process time, {_ratio(d['speedup_cpu'])} in CPU time "
        f"(time to it × cores busy). {s['seeds']} seeds × {s['steps']} steps"
        + (", each system configured by a tuning pass in the same invocation." if not untuned else ".")
    )


def vs_trl_goals() -> str:
    """Issue 62's goals on the toy job as the results file's summary decides them (benchmarks/vs_trl_report.py),
    each with its figure."""
    s = load("vs_trl.json")
    summ, k = s["summary"], s["k_async_fixed_before_runs"]
    d = summ["headline"][f"agent-rl k={k}"]
    (step_goal, step_ok), (train_goal, train_ok), (process_goal, process_ok) = summ["goals"].items()
    tune, chosen = s["tuning"]["median_s_per_step"], s["tuning"]["chosen"]
    tuned = tune[f"agent-rl k=0: {chosen['agent-rl k=0']['label']}"] / tune[f"trl: {chosen['trl']['label']}"]

    def said(ok: bool | None) -> str:
        return "**reached**" if ok else "**not reached**"

    return "\n".join([
        f"- `{train_goal}`: {said(train_ok)}, {_ratio(d['speedup_train'])} in training time; `{process_goal}`: "
        f"{said(process_ok)}, {_ratio(d['speedup_process'])}.",
        f"- `{step_goal}`: {said(step_ok)}, {_ratio(summ['agent_rl_k0_over_fastest_trl_s_per_step'])} the step of "
        f"{summ['fastest_trl_step_cell']} (median s/step over {s['seeds']} seeds × {s['steps']} steps); in the "
        f"tuning pass ({s['tuning']['steps']} steps) {_ratio(tuned)}.",
    ])  # fmt: skip


def learner_step_agent_arith() -> str:
    """Each CPU-time ratio of benchmarks/learner_step_agent_arith.py's results (1 and 2 threads): the per-round
    median with its min and max."""
    lines = []
    for name in ("learner_step_agent_arith.json", "learner_step_agent_arith_2threads.json"):
        d = load(name)
        c = d["config"]
        for label, r in d["ratios"].items():
            if not label.endswith("(cpu)"):
                continue
            lines.append(
                f"- {label[: -len(' (cpu)')]}: **{_ratio(r['median'])}** the CPU time ({r['min']:.2f}-{r['max']:.2f}"
                f" over {len(r['rounds'])} rounds; {c['threads']} thread(s), "
                f"{_load_text(*(' '.join(map(str, d['meta'][k])) for k in ('load_before', 'load_after')))})"
            )
    return "\n".join(lines)


def async_headline() -> str:
    """Async k=K (fixed before the runs) against sync: the median of the per-seed ratios, which it lists."""
    s = load("async_vs_sync.json")["summary"]
    seeds = ", ".join(f"{x:.2f}" for x in s["fixed_k_speedup_train_per_seed"])
    process = s.get("fixed_k_speedup_process")
    return (
        f"async k={s['k_fixed_before_runs']} (fixed before the runs) reaches synchronous training's final held-out "
        f"accuracy **{_ratio(s['fixed_k_speedup_train'])} sooner** in training time (the median of the per-seed "
        f"ratios {seeds}), final accuracy {s['fixed_k_final_accuracy_mean']:.3f} vs {s['sync_final_accuracy']:.3f}; "
        + ("whole-process time was not recorded by that run."
           if process is None else f"{_ratio(process)} in whole-process time.")
    )  # fmt: skip


def _load_text(start: str, end: str | None = None) -> str:
    """'load 15.6 → 22.2' from 'load average' strings ('15.58 10.52 5.33'): the 1-minute figures."""
    a = float(str(start).split()[0])
    return f"load {a:.1f}" + (f" → {float(str(end).split()[0]):.1f}" if end is not None else "")


def _loaded(load: float, cores: int) -> str:
    """What a row says of a time taken on a machine busier than its cores."""
    return "; loaded by other jobs: not an idle-machine time" if load > cores else ""


@dataclass(frozen=True)
class Row:
    """One row of the front page's table."""

    job: str
    figure: str
    against: str
    machine: str
    page: str  # under docs/

    def cells(self, docs: str) -> list[str]:
        return [self.job, self.figure, self.against, self.machine, f"[more]({docs}{self.page})"]


def _pipeline_row(name: str, job: str, page: str) -> Row:
    """A row from a pipeline's results file (examples/pipeline.py: `make run`, `make run-swe`)."""
    r = load(name)
    b, a = r["report"]["before"], r["report"]["after"]
    start = float(r["load_average_at_start"].split()[0])
    cores = int(r["machine"].split(", ")[1].split()[0])
    return Row(
        job,
        f"held-out accuracy **{b['accuracy']:.2f} → {a['accuracy']:.2f}** on {a['tasks']} tasks, "
        f"{r['minutes_total']:.1f} min end to end",
        "its own warm start",
        f"{r['machine']}, {_load_text(r['load_average_at_start'], r['load_average_at_end'])}{_loaded(start, cores)} "
        f"({r['started'][:10]})",
        page,
    )


def main_job_row() -> Row:
    return _pipeline_row(
        "main_job.json", "the main job (`make run`, a 2.1M-parameter toy model)", "benchmarks/main-job.md"
    )


def swe_tiny_row() -> Row:
    return _pipeline_row(
        "swe_tiny.json",
        "bug fixes in containers (`make run-swe`, toy model, pytest as the reward)",
        "guides/harbor.md",
    )


def async_row() -> Row:
    d = load("async_vs_sync.json")
    s = d["summary"]
    return Row(
        "async vs sync (toy model, a long-tail multi-turn task)",
        f"async k={s['k_fixed_before_runs']} reaches sync's final accuracy **{_ratio(s['fixed_k_speedup_train'])} "
        f"sooner** in training time (median of {len(s['fixed_k_speedup_train_per_seed'])} per-seed ratios)",
        f"synchronous training, the same seeds ({s['sync_baseline']})",
        d["machine"].replace("load average at start", "load"),
        "benchmarks/async-vs-sync.md",
    )


VS_TRL_EARLIER = ("vs_trl_mb64.json", "vs_trl_rerun.json", "vs_trl_lasthalf.json")
"""Earlier invocations of vs_trl.py committed beside vs_trl.json (the same job and cells; their tuning passes timed
the last half of each candidate's steps, 10 or 30, and chose k=2's learner micro-batch differently), oldest first."""


def _vs_trl_earlier() -> str:
    """The earlier invocations' k=2 figures in training time (the page's vs_trl_invocations table has the rest)."""
    ratios = []
    for file in VS_TRL_EARLIER:
        d = load(file)
        ratios.append(
            _ratio(d["summary"]["headline"][f"agent-rl k={d['k_async_fixed_before_runs']}"]["speedup_train"])
        )
    return " and ".join(ratios) + " in training time"


def vs_trl_invocations() -> str:
    """The committed invocations of vs_trl.py side by side: k=2's two processes-topology candidates in each tuning
    pass (the recipe's learner micro-batch and the whole step), what it chose, and each cell's training seconds."""

    def secs(d: dict, cell: str) -> list[float]:
        return sorted(c["train_seconds"] for c in d["cells"] if cell_name(c) == cell)

    def span(d: dict, cell: str) -> str:
        return f"{secs(d, cell)[0]:.0f}-{secs(d, cell)[-1]:.0f}"

    rows = [
        "| invocation | tuning: steps a candidate, timed | k=2 processes, micro-batch 4 / whole step: tuned s/step | k=2 chose "
        "| training s a seed: k=2 / the TRL cell it is set against / k=0 | k=2 sooner: training, whole-process |",
        "|---|---|---|---|---|---|",
    ]
    for file in (*VS_TRL_EARLIER, "vs_trl.json"):
        d = load(file)
        k = f"agent-rl k={d['k_async_fixed_before_runs']}"
        tune, chosen = d["tuning"]["median_s_per_step"], d["tuning"]["chosen"][k]
        four = tune[f"{k}: default threads, processes"]
        whole = tune[f"{k}: default threads, processes, learner micro-batch {d['samples_per_step']}"]
        h = d["summary"]["headline"]
        rows.append(
            f"| [{d['date']}](../../benchmarks/results/{file.removesuffix('.json')}.md) | {d['tuning']['steps']}, {d['tuning']['timed'].removesuffix(', mean')} | "
            f"{four:.2f} / {whole:.2f} | {'whole step' if chosen['learner_micro_batch'] else 'micro-batch 4'} | "
            f"{span(d, k)} / {span(d, h['against'])} / {span(d, 'agent-rl k=0')} | "
            f"{_ratio(h[k]['speedup_train'])}, {_ratio(h[k]['speedup_process'])} |"
        )
    return "\n".join(rows)


def vs_trl_row() -> Row:
    d = load("vs_trl.json")
    h, k = d["summary"]["headline"], d["k_async_fixed_before_runs"]
    x = h[f"agent-rl k={k}"]
    return Row(
        "against TRL (toy model, an OpenAI function-calling agent)",
        f"agent-rl k={k} reaches 90% of k=0's final accuracy {_sooner(x['speedup_train'])} in training time; "
        f"{_ratio(x['speedup_process'])} in whole-process, {_ratio(x['speedup_cpu'])} in CPU time; earlier invocations {_vs_trl_earlier()}",
        f"TRL GRPOTrainer's fastest cell ({h['against_config']}), both tuned in the same invocation",
        f"{d['machine'].split(';')[0]}; load {d['machine'].split('load average ')[1].split(' (')[0]} ({d['date'][:10]})",
        "benchmarks/vs-trl.md",
    )


def _ks(ks: list) -> str:
    return ", ".join(str(k) for k in ks)


def staleness_row() -> Row:
    report = load("stress/level_b_fair.json")
    words: dict[str, dict[str, list[int]]] = {}
    for c in staleness_comparisons():
        who = "VCPO at the baseline's lr" if "baseline's lr" in c.what else c.what  # e.g. "VCPO at 5e-4"
        words.setdefault(who, {}).setdefault(c.word, []).append(c.k)
    figure = "; ".join(
        f"{who}: " + ", ".join(f"{w} at k={_ks(ks)}" for w, ks in by.items()) for who, by in words.items()
    )
    return Row(
        f"staleness, lr-matched (tiny_arith, {report['design']['steps']} steps, k ≤ {max(report['design']['lags'])})",
        figure,
        "the best baseline at each k, at its own best lr",
        "shared 2-core CPU; load not recorded by the study",
        "studies/staleness.md",
    )


def k_sweep_row() -> Row:
    report = load("stress/k_sweep2.json")
    d, summ, vs = report["design"], report["summary"], report["vcpo_vs"]
    sides: dict[str, list[str]] = {}
    for k, s in summ.items():
        if "vcpo_side" in s:
            sides.setdefault(s["vcpo_side"], []).append(k)
    ahead = [
        f"k={k} {sum(by[k]['separated'] and by[k]['difference'] > 0 for by in vs.values() if k in by)}/"
        f"{sum(k in by for by in vs.values())}"
        for k in map(str, d["lags"]) if any(k in by for by in vs.values())
    ]  # fmt: skip
    side_text = {"ahead": "ahead of", "level": "level with", "behind": "behind"}
    return Row(
        f"the k-sweep (tiny_multistep, {d['steps']} steps, k ≤ {max(d['lags'])})",
        "VCPO's final accuracy "
        + "; ".join(f"{side_text[w]} the best other method at k={_ks(ks)}" for w, ks in sides.items())
        + f" (2 SE rule); ahead of (methods, of those compared): {', '.join(ahead)}",
        f"{len(d['methods']) - 1} methods, each at its best lr at k={d['select_lag']}",
        "shared 2-core CPU; load not recorded by the sweep",
        f"studies/staleness.md#{K_SWEEP_SECTION}",
    )


def gpu_row() -> Row:
    """Both learners against the anchor on one GPU: proxy and exact OPOB named, and which anchor cell."""
    meta, cells = _gpu_cells()
    runs = _gpu_runs()
    proxy = _gpu_pairs([(meta, cells)], _proxy, _anchor)
    exact = _gpu_pairs(runs, _exact, _anchor)

    def by_length(pairs: list[tuple[str, float]]) -> str:
        out: dict[str, list[float]] = {}
        for b, x in pairs:
            out.setdefault(f"{int(b.split(' x ')[1].split()[0]) // 1024}k", []).append(x)
        return ", ".join(f"{_span(xs)} at {n}" for n, xs in out.items())

    meg, anchor = cells.get(_megatron(2, 131072, True)), cells.get(_anchor(2, 131072, True))
    tail = (
        f"; Megatron 2 x 131072 in {meg['peak_gib']:.1f} GiB at {meg['tokens_per_s'] / anchor['tokens_per_s']:.2f}x"
        if meg and anchor
        else ""
    )
    micro = {c["micro_batch_tokens"] for c in cells.values() if c["backend"] == "anchor"}
    return Row(
        "both learners on one GPU (Qwen2.5-0.5B shape)",
        f"tokens/s over the anchor's: torch learner, proxy OPOB + recompute {by_length(proxy)}; exact OPOB (the "
        f"default) {by_length(exact)}{tail}",
        f"transformers + Liger cells of the same batch and recompute ({', '.join(f'{m // 1024}k' for m in sorted(micro))}"
        "-token micro-batches); not the anchor at its best (all rows in one forward), which no results file holds",
        f"{meta['device']} (runs of {' and '.join(sorted({m['date'][:10] for m, _ in runs}))})",
        "benchmarks/gpu-learners.md",
    )


ROWS = (main_job_row, swe_tiny_row, async_row, vs_trl_row, staleness_row, k_sweep_row, gpu_row)


def headline(docs: str = "docs/") -> str:
    """The front page's table: one row per job, each from its results file, linking to the page with the verdict
    in full (the statistics, the caveats)."""
    from benchmarks.harness.report import table

    rows = [r().cells(docs) for r in ROWS]
    return "\n".join(table(["job", "figure", "compared with", "machine and load", "page"], rows))


FULL_VS_TRL = (3, 30)  # seeds x steps of `make bench-trl`


def _busier(cells: dict, k: int) -> str:
    """How agent-rl k's cores busy compares with the TRL cells', for the CPU-time sentence."""
    ours = cells[f"agent-rl k={k}"]["cores_busy"]["median"]
    trl = [c["cores_busy"]["median"] for name, c in cells.items() if name.startswith("trl")]
    if ours > max(trl):
        return "uses more of the two cores than every TRL cell, which the CPU-time ratio charges it for"
    if ours < min(trl):
        return "uses less of the two cores than every TRL cell (a core partly idle), which the CPU-time ratio credits"
    return "uses as much of the two cores as the TRL cells, within their range"


def vs_trl_caveats() -> str:
    """What the measured vs_trl invocation did and how strong its headline is, from vs_trl.json."""
    s = load("vs_trl.json")
    summ, cells, t = s["summary"], s["summary"]["per_cell"], s["tuning"]
    h = summ.get("headline")
    if not h:
        return "- `benchmarks/results/vs_trl.json` predates the tuned comparison: run `make bench-trl`."
    k = s["k_async_fixed_before_runs"]
    chosen = {n: c["label"] for n, c in t["chosen"].items()}
    trl = {c.split(": ", 1)[1]: v for c, v in t["median_s_per_step"].items() if c.startswith("trl: ")}
    if _vs_trl_tuned(s):
        out = [
            f"- The measured invocation (`{s['command']}`, {s['date']}; {s['machine']}) ran its own tuning pass "
            f"first ({t['steps']} steps per candidate, the candidates interleaved): TRL fastest with {chosen['trl']} "
            f"({trl[chosen['trl']]:.2f} s/step; "
            + ", ".join(
                f"{c} " + ("failed" if v is None else f"{v:.2f}")
                for c, v in trl.items()
                if c != chosen["trl"]
            )
            + f"), agent-rl k=0 with {chosen['agent-rl k=0']}, k={k} with {chosen[f'agent-rl k={k}']} "
            "(every candidate in the results file)."
        ]
    else:
        out = [
            f"- The measured invocation (`{s['command']}`, {s['date']}) ran no tuning pass: its configurations came "
            f"from an earlier pass on a loaded machine (TRL: {chosen['trl']}). The script now always runs the pass "
            "first and refuses `--tune-steps 0`."
        ]
        quick = load("vs_trl_quick.json")["tuning"]
        q = {
            c.split(": ", 1)[1]: v
            for c, v in quick.get("median_s_per_step", {}).items()
            if c.startswith("trl:")
        }
        if q:
            best = min(q, key=q.get)
            out.append(
                f"- The only tuning pass on record (`vs_trl_quick.json`, {quick['steps']} steps per candidate) had "
                f"TRL fastest with {best} ({q[best]:.2f} s/step against "
                + ", ".join(f"{c} {v:.2f}" for c, v in q.items() if c != best)
                + ")."
            )
        if "trl shipped-constant-lr" not in cells:
            out.append(
                "- It has no TRL cell with TRL's default loss and a constant lr (the lr schedule apart)."
            )
    out += [
        "- TRL cells by median training time to the target ("
        + h["target"]
        + "): "
        + "; ".join(
            f"{c['cell']} {c['time_to_target_s']:.0f} s" if c["time_to_target_s"] is not None
            else f"{c['cell']} not reached in most seeds ({c['reached']}/{c['runs']})"
            for c in h["trl_cells_by_time_to_target"]
        )
        + f". The headline is against the fastest ({h['against']}).",
        f"- Against each TRL cell's own final accuracy, agent-rl k={k} is sooner by (training time, whole-process): "
        + "; ".join(
            f"{name} {_ratio(summ[f'time_to_trl_final_speedup{x}'])}, {_ratio(summ[f'time_to_trl_final_speedup_process{x}'])}"
            for name, x in (("as shipped (lr decayed linearly to 0 over the run)", ""),
                            ("shipped with a constant lr", "_constant_lr"), ("closest loss", "_closest"))
            if summ.get(f"time_to_trl_final_speedup{x}") is not None
        )
        + ".",
        "- Cores busy (CPU seconds over wall time, median): "
        + ", ".join(f"{name} {c['cores_busy']['median']:.2f}" for name, c in cells.items())
        + f"; agent-rl k={k} {_busier(cells, k)}.",
    ]  # fmt: skip
    if (s["seeds"], s["steps"]) != FULL_VS_TRL:
        out.append(
            f"- {s['seeds']} seed(s) × {s['steps']} steps: not the full set ({FULL_VS_TRL[0]} seeds × "
            f"{FULL_VS_TRL[1]} steps), which `nice -n 15 .venv/bin/python benchmarks/vs_trl.py` (or `make bench-trl`) "
            "runs; it reuses the finished runs of an earlier invocation in `runs/bench_vs_trl`."
        )
    return "\n".join(out)


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    m = mean_se(values)
    return m.mean, m.se


def _gap_word(diff: float, se: float | None, up: str, down: str) -> str:
    if diff == 0 and not se:
        return "identical"
    if se is None:
        return "one seed, no spread"
    return Gap(diff, se).side(up, down)


def moe_replay_verdict() -> str:
    """What routing replay changed on the tiny MoE (benchmarks/results/moe_replay.json): per-seed paired gaps."""
    r = load("moe_replay.json")
    cells = {(c["dtype"], c["replay"], c["seed"]): c for c in r["mismatch"]}
    lines = []
    for dtype in ("float32", "bfloat16"):
        seeds = sorted(s for d, rp, s in cells if d == dtype and rp == "off" and (d, "rollout", s) in cells)
        if not seeds:
            lines.append(f"- {dtype}: **missing** (not run yet).")
            continue
        agree, _ = _mean_se([cells[dtype, "off", s]["routing_agreement"] for s in seeds])
        gaps = [
            cells[dtype, "rollout", s]["mismatch_mean"] - cells[dtype, "off", s]["mismatch_mean"]
            for s in seeds
        ]
        off, _ = _mean_se([cells[dtype, "off", s]["mismatch_mean"] for s in seeds])
        gap, se = _mean_se(gaps)
        word = _gap_word(gap, se, "higher with replay", "lower with replay")
        spread = f" ± {se:.2g}" if se is not None else ""
        lines.append(
            f"- {dtype}, one learner step: the learner routed {1 - agree:.2%} of (token, MoE layer) pairs elsewhere "
            f"than the engine without replay; replay moved the mean |log π − log μ| by {gap:+.2g}{spread} "
            f"(from {off:.2g}; {len(seeds)} paired sampling seeds): **{word}**."
        )
    rl = r["rl"]
    pairs = sorted(
        s
        for s in {c["seed"] for c in rl}
        if {c["replay"] for c in rl if c["seed"] == s} == {"off", "rollout"}
    )
    by = {(c["replay"], c["seed"]): c for c in rl}
    steps = r["args"]["steps"]
    if not pairs:
        lines.append(f"- RL in bf16 at k=4, {steps} steps: **missing** (not run yet).")
    else:
        acc, se = _mean_se([by["rollout", s]["accuracy"] - by["off", s]["accuracy"] for s in pairs])
        low = {rp: min(by[rp, s]["ess_ratio_min"] for s in pairs) for rp in ("off", "rollout")}
        lines.append(
            f"- RL in bf16 at k=4, {steps} steps, {len(pairs)} paired seed(s): held-out accuracy with replay minus "
            f"without {acc:+.2f}"
            + (f" ± {se:.2f}" if se is not None else "")
            + f": **{_gap_word(acc, se, 'higher with replay', 'lower with replay')}**; the lowest ESS ratio of any "
            f"step {low['off']:.2f} without replay, {low['rollout']:.2f} with it."
        )
    for p in r.get("rl_partial", []):
        off, on = p["off"], p["rollout"]
        lines.append(
            f"- RL seed {p['seed']}, unfinished pair over the first {p['steps']} steps both logged (one seed: no "
            f"verdict): mean reward {off['reward_mean']:.3f} without replay, {on['reward_mean']:.3f} with it; lowest "
            f"ESS ratio {off['ess_ratio_min']:.2f} vs {on['ess_ratio_min']:.2f}; mean routing agreement "
            f"{off['agreement_mean']:.2%} vs {on['agreement_mean']:.2%}."
        )
    missing = r["meta"].get("missing") or []
    if missing:
        lines.append(f"- Not run yet: {'; '.join(missing)}.")
    lines.append(
        f"\n(`benchmarks/results/moe_replay.json`, {r['meta']['date']}, commit {r['meta']['commit']}; gaps are means "
        f"of per-seed differences ± their standard error, named only at {SEPARATED_AT_SE:g} SE or more.)"
    )
    return "\n".join(lines)


def reliability_faults() -> str:
    """The fault campaign's table (each fault run beside its uninterrupted run) and totals, as in its results file."""
    from scripts.reliability import fault_table

    return "\n".join(fault_table(load("reliability.json"))).rstrip() + "\n"


# -- both learners on one GPU (benchmarks/results/gpu_learners.json) -------------------------------------------


# The runs before the newest one, newest first, kept whole: a run inside its budget measures the cells first in
# its plan, and the pages compare the newest with the one before it (the code between them: the log-prob head's
# backward in the matmul's dtype) and show an earlier run's figure for a cell the newer ones did not reach.
EARLIER_GPU_RUNS = ("gpu_learners_2026-11-28-9e6cdae.json", "gpu_learners_2026-11-27.json")
PREVIOUS_GPU_RUN = EARLIER_GPU_RUNS[0]


def _gpu_cells(name: str = "gpu_learners.json") -> tuple[dict, dict[str, dict]]:
    r = load(name)
    return r["meta"], {c["name"]: c for c in r["cells"] if c["status"] == "ok"}


def _cell(backend: str, rows: int, length: int, *, ckpt: bool = False, opob: str = "exact") -> str:
    what = "anchor" if backend == "anchor" else f"{backend} {opob}"
    return f"{what}{' +ckpt' if ckpt else ''} {rows}x{length}"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def _gpu_pairs(
    runs: list[tuple[dict, dict[str, dict]]], num, den, key: str = "tokens_per_s"
) -> list[tuple[str, float]]:
    """(batch label, num/den of `key`) for every batch and recompute setting where both cells ran in the first of
    `runs` ((meta, cells), newest first) that measured both: a ratio is always of two cells of one run. A batch
    taken from a run after the first has that run's date and commit in its label."""
    out = []
    for rows, length in ((8, 4096), (4, 8192), (2, 32768), (2, 131072)):
        for ckpt in (False, True):
            for i, (meta, cells) in enumerate(runs):
                a, b = cells.get(num(rows, length, ckpt)), cells.get(den(rows, length, ckpt))
                if a and b:
                    when = f" ({meta['date'][:10]}, {meta['commit']})" if i else ""
                    out.append((f"{rows} x {length}{' +ckpt' if ckpt else ''}{when}", a[key] / b[key]))
                    break
    return out


def _gpu_runs() -> list[tuple[dict, dict[str, dict]]]:
    """The newest GPU run, then the earlier ones, newest first."""
    return [_gpu_cells(), *(_gpu_cells(name) for name in EARLIER_GPU_RUNS)]


def _proxy(r: int, n: int, c: bool) -> str:
    return _cell("torch", r, n, ckpt=c, opob="proxy")


def _exact(r: int, n: int, c: bool) -> str:
    return _cell("torch", r, n, ckpt=c)


def _megatron(r: int, n: int, c: bool) -> str:
    return _cell("megatron", r, n, ckpt=c)


def _anchor(r: int, n: int, c: bool) -> str:
    return _cell("anchor", r, n, ckpt=c)


def _lora(r: int, n: int, c: bool) -> str:
    return f"torch proxy{' +ckpt' if c else ''} +lora {r}x{n}"


def gpu_learners_goals(docs: str = "") -> str:
    """Issue 33's goals against the GPU run, and the memory model's estimate against the measured peaks."""
    meta, cells = _gpu_cells()

    def listed(pairs: list[tuple[str, float]]) -> str:
        return "; ".join(f"{b}: {x:.2f}x" for b, x in pairs)

    def word(ok: bool) -> str:
        return "yes" if ok else "**no**"

    # a batch the newest run had no time for counts with its newest earlier measurement (labelled so): a goal is
    # not reached by leaving out the cells that missed it
    runs = _gpu_runs()
    proxy = _gpu_pairs(runs, _proxy, _anchor)
    mem = [x for _, x in _gpu_pairs(runs, _proxy, _anchor, key="peak_gib")]
    exact = [(b, 1 / x) for b, x in _gpu_pairs(runs, _exact, _proxy)]  # step time ratio = inverse tokens/s
    meg = _gpu_pairs(runs, _megatron, _exact)
    lines = [
        f"{meta['date'][:10]}, commit {meta['commit']}, {meta['device']}, torch {meta['versions']['torch']}, "
        f"megatron-core {meta['versions']['megatron-core']}, liger-kernel {meta['versions']['liger-kernel']}; "
        f"{len(cells)} cells ran in {meta['elapsed_s']:.0f} s.",
        "",
        "| goal (issue 33) | measured | reached |",
        "|---|---|---|",
        f"| torch proxy OPOB >= 1.0x the anchor's tokens/s at no more memory | {listed(proxy)}; memory "
        f"{_span(mem)} the anchor's | {word(all(x >= 1 for _, x in proxy) and max(mem) <= 1)} |",
        f"| exact OPOB's step <= 1.25x proxy's | {listed(exact)} | {word(all(x <= 1.25 for _, x in exact))} |",
        f"| Megatron TP=1 >= 1.0x the torch learner (exact OPOB both) | {listed(meg)} | "
        f"{word(all(x >= 1 for _, x in meg))} |",
    ]
    for rows, length, what in (
        (2, 32768, "a 32k-token trajectory trains with recompute"),
        (2, 131072, "128k fits"),
    ):
        c, a = cells.get(_megatron(rows, length, True)), cells.get(_anchor(rows, length, True))
        got = (
            f"Megatron {rows} x {length} + recompute: {c['tokens_per_s'] / 1e3:.1f}k tok/s, {c['peak_gib']:.1f} GiB"
            + (f" ({c['tokens_per_s'] / a['tokens_per_s']:.2f}x the anchor)" if a else "")
            if c
            else "did not run"
        )
        lines.append(f"| {what} | {got} | {word(c is not None)} |")
    est = sorted(
        (c["estimate_gib"] / c["peak_gib"], n)
        for n, c in cells.items()
        if c.get("estimate_gib") and c.get("peak_gib")
    )
    inside = [x for x, _ in est if 0.75 <= x <= 1.25]
    outside = [f"{n}: {x:.2f}" for x, n in est if not 0.75 <= x <= 1.25]
    lines += [
        "",
        f"The memory model's estimate over the measured peak (`torch.cuda.max_memory_allocated`): {_span(inside)} "
        f"in {len(inside)} of {len(est)} cells"
        + (f"; outside 25 %: {', '.join(outside)}." if outside else "."),
    ]
    return "\n".join(lines) + "\n"


def gpu_learners_table(docs: str = "") -> str:
    """Tokens/s (ratio to the anchor) and peak memory of each learner at the batches users pick between."""
    meta, cells = _gpu_cells()
    earlier_runs = _gpu_runs()[1:]
    planned = {c["name"] for c in load("gpu_learners.json")["cells"]}

    def figure(x: dict, a: dict | None) -> str:
        ratio = f" ({x['tokens_per_s'] / a['tokens_per_s']:.2f}x)" if a and x is not a else ""
        return f"{x['tokens_per_s'] / 1e3:.1f}k tok/s{ratio}, {x['peak_gib']:.1f} GiB"

    cols = [(8, 4096, False), (8, 4096, True), (4, 8192, True), (2, 32768, True), (2, 131072, True)]
    rows = [
        ("anchor", _anchor), ("torch, proxy OPOB", _proxy), ("torch, exact OPOB", _exact),
        ("megatron TP=1 (exact)", _megatron),
        ("torch proxy + LoRA r8", _lora),
    ]  # fmt: skip
    lines = [
        f"| {meta['device']}, {meta['date'][:10]} | " + " | ".join(f"{r} x {n}{' +ckpt' if c else ''}" for r, n, c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]  # fmt: skip
    for label, name in rows:
        out = []
        for r, n, c in cols:
            x, a = cells.get(name(r, n, c)), cells.get(_anchor(r, n, c))
            if x is not None:
                out.append(figure(x, a))
                continue
            gone = ["not run (time)"] if name(r, n, c) in planned else []
            # the newest earlier run that has it
            ran = [(b, e) for b, e in earlier_runs if name(r, n, c) in e]
            if ran:
                b, e = ran[0]
                gone.append(
                    f"{b['date'][:10]} ({b['commit']}): {figure(e[name(r, n, c)], e.get(_anchor(r, n, c)))}"
                )
            out.append("; ".join(gone))
        lines.append(f"| {label} | " + " | ".join(out) + " |")
    return "\n".join(lines) + "\n"


def gpu_learners_since(docs: str = "") -> str:
    """The newest GPU run against the one before it, cell by cell where both ran."""
    meta, cells = _gpu_cells()
    before, earlier = _gpu_cells(PREVIOUS_GPU_RUN)

    def vs_anchor(run: dict[str, dict], name: str) -> str:
        c = run[name]
        a = run.get(_anchor(c["rows"], c["length"], c["recompute"]))
        return f" ({c['tokens_per_s'] / a['tokens_per_s']:.2f}x)" if a and a is not c else ""

    lines = [
        f"{before['date'][:10]} (commit {before['commit']}) against {meta['date'][:10]} (commit {meta['commit']}), "
        f"both on one {meta['device']}; tokens/s (its ratio to the anchor of the same run) and peak memory, "
        "for every cell both runs measured.",
        "",
        f"| cell | {before['date'][:10]} ({before['commit']}) | {meta['date'][:10]} ({meta['commit']}) | tokens/s, newest "
        "/ before | peak GiB, before -> newest |",
        "|---|---|---|---|---|",
    ]
    for name, c in cells.items():
        if name not in earlier:
            continue
        o = earlier[name]
        lines.append(
            f"| {name} | {o['tokens_per_s'] / 1e3:.1f}k{vs_anchor(earlier, name)} | "
            f"{c['tokens_per_s'] / 1e3:.1f}k{vs_anchor(cells, name)} | {c['tokens_per_s'] / o['tokens_per_s']:.2f}x | "
            f"{o['peak_gib']:.1f} -> {c['peak_gib']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def slow_tools_bound() -> str:
    """How busy the swe_tiny runs kept the machine's cores (benchmarks/results/slow_tools_bound.json, the per-run
    `core_busy` of benchmarks/slow_tools.py): the most that any overlap of the same work can shorten sync's step is
    cores / cores busy."""
    d = load("slow_tools_bound.json")
    m, design = d["meta"], d["design"]
    n = m["cpu"]["cores"]

    def busy(cell: str) -> tuple[float, str]:
        runs = [sum(r["core_busy"]) for r in d["cells"] if r["cell"] == cell]
        return d["summary"]["per_cell"][cell]["cores_busy_median"], ", ".join(f"{x:.2f}" for x in runs)

    (sync, sync_runs), (k2, k2_runs) = busy("sync k=0"), busy("async k=2")
    return (
        f"- **What bounds it, measured**: sync k=0 kept **{sync:.2f} of the {n} cores** busy machine-wide (median of "
        f"{design['seeds']} runs: {sync_runs}), async k=2 {k2:.2f} ({k2_runs}), the containers' pytest included "
        f"(/proc/stat over each run). Overlapping the same work can then shorten a step by at most {n} / {sync:.2f} = "
        f"**{n / sync:.2f}×**: the 2× goal cannot be reached on these {n} cores. "
        f"([results](../../benchmarks/results/slow_tools_bound.md): `{m['command']}`, {design['sync_steps']} sync "
        f"steps a run, {m['date'][:10]}, commit {m['commit']}, load {m['load_before'][0]:.2f} at the start.)"
    )


GENERATED = {  # name -> function of the docs prefix ("docs/" in README.md, "" in a page under docs/)
    "headline": lambda docs: headline(docs=docs),
    "staleness_verdict": lambda docs: staleness_verdict(),
    "k_sweep_verdict": lambda docs: k_sweep_verdict(),
    "async_headline": lambda docs: async_headline(),
    "vs_trl_headline": lambda docs: vs_trl_headline(),
    "vs_trl_caveats": lambda docs: vs_trl_caveats(),
    "vs_trl_goals": lambda docs: vs_trl_goals(),
    "vs_trl_invocations": lambda docs: vs_trl_invocations(),
    "learner_step_agent_arith": lambda docs: learner_step_agent_arith(),
    "moe_replay_verdict": lambda docs: moe_replay_verdict(),
    "reliability_faults": lambda docs: reliability_faults(),
    "gpu_learners_goals": lambda docs: gpu_learners_goals(docs),
    "gpu_learners_table": lambda docs: gpu_learners_table(docs),
    "gpu_learners_since": lambda docs: gpu_learners_since(docs),
    "slow_tools_bound": lambda docs: slow_tools_bound(),
}
