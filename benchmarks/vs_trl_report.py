"""benchmarks/vs_trl.py's summary (targets, ratios per seed and their medians), its markdown table and plot.

`summarise` is pure: it takes the cell records (one per run: system, loss, k, seed, s_per_step, cores_busy,
curves of (seconds, held-out accuracy)) and returns the summary; it also writes each cell's `time_to_target_s`,
`time_to_target_process_s` and `accuracy_at_budget` into the record. Cell names: "agent-rl k=K", "trl LOSS".

The headline (`summary["headline"]`) compares agent-rl at the async k with the TRL cell that reaches the target
soonest (the target: 90% of agent-rl k=0's final accuracy, per seed; median over seeds, most seeds must get
there), never with a slower TRL cell. When no TRL cell gets there in most seeds, it is against the TRL cell with
the best final accuracy, to that cell's own final accuracy, and says so. Each figure comes with both cells'
cores busy and a CPU-time ratio (time to target x the run's cores busy), since agent-rl's async cell keeps more
than one core busy.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.report import time_curves  # noqa: E402
from benchmarks.harness.stats import accuracy_at, median_or_none, median_speedup, ratio, spread, time_to  # noqa: E402

TARGET_SHARE = 0.9  # time to 90% of agent-rl k=0's final accuracy (paired by seed)
GOAL_S_PER_STEP = 1.0  # issue 62: agent-rl k=0's step at or under the fastest TRL cell's
GOAL_SPEEDUP = 1.5  # issue 62 (toy): agent-rl async to the target >= 1.5x sooner than TRL's fastest cell
GOAL_PROCESS = 1.2  # issue 62 (toy): the same in whole-process time


def cell_name(r: dict) -> str:
    return f"agent-rl k={r['k']}" if r["system"] == "agent-rl" else f"trl {r['loss']}"


def _by_seed(records: list[dict], name: str, key: str) -> dict[int, float | None]:
    return {r["seed"]: r[key] for r in records if cell_name(r) == name}


def _seed_ratios(num: dict[int, float | None], den: dict[int, float | None]) -> dict[int, float | None]:
    return {s: ratio(num.get(s), den.get(s)) for s in sorted(num)}


TRL_SUFFIX = {"trl shipped": "", "trl closest": "_closest", "trl shipped-constant-lr": "_constant_lr"}


def _times(records: list[dict], name: str, key: str, goal: dict[int, float]) -> dict[int, float | None]:
    """Per seed: when the cell's `key` curve first reaches that seed's goal."""
    return {
        r["seed"]: time_to(r[key], goal[r["seed"]])
        for r in records
        if cell_name(r) == name and r["seed"] in goal
    }


def _cpu_times(records: list[dict], name: str, goal: dict[int, float]) -> dict[int, float | None]:
    """Per seed: CPU seconds to the goal, approximated as whole-process time to it x the run's cores busy."""
    out: dict[int, float | None] = {}
    for r in records:
        if cell_name(r) == name and r["seed"] in goal:
            t = time_to(r["curve_process"], goal[r["seed"]])
            out[r["seed"]] = None if t is None or r["cores_busy"] is None else t * r["cores_busy"]
    return out


def _speedups(records: list[dict], ours: str, theirs: str, goal: dict[int, float]) -> dict:
    """theirs' time to the goal / ours, seed by seed and its median, in training, process and CPU time."""
    out: dict = {}
    for axis, of in (
        ("train", lambda n: _times(records, n, "curve", goal)),
        ("process", lambda n: _times(records, n, "curve_process", goal)),
        ("cpu", lambda n: _cpu_times(records, n, goal)),
    ):
        out[f"speedup_{axis}"], out[f"speedup_{axis}_per_seed"] = median_speedup(of(theirs), of(ours))
    return out


def headline(records: list[dict], per_cell: dict, k_async: int, target: dict[int, float]) -> dict | None:
    """agent-rl k=k_async (and k=0) against the fastest TRL cell to the target; None without TRL cells."""
    trl = [n for n in per_cell if n.startswith("trl ")]
    if not trl:
        return None
    ranked = sorted(
        trl, key=lambda n: (per_cell[n]["time_to_target_s"] is None, per_cell[n]["time_to_target_s"] or 0.0)
    )
    fastest = ranked[0]
    if per_cell[fastest]["time_to_target_s"] is not None:
        goal, what = target, f"{int(100 * TARGET_SHARE)}% of agent-rl k=0's final accuracy"
    else:  # no TRL cell got there in most seeds: the best TRL cell, to its own final accuracy
        fastest = max(trl, key=lambda n: per_cell[n]["final_accuracy_mean"])
        goal = {s: a for s, a in _by_seed(records, fastest, "final_accuracy").items() if a is not None}
        what = f"the final accuracy of {fastest} (no TRL cell reached {int(100 * TARGET_SHARE)}% of k=0's final in most seeds)"
    out = {
        "against": fastest,
        "against_config": per_cell[fastest]["config"],
        "target": what,
        "trl_cells_by_time_to_target": [
            {
                "cell": n,
                "time_to_target_s": per_cell[n]["time_to_target_s"],
                "reached": per_cell[n]["reached_target"],
                "runs": per_cell[n]["runs"],
            }
            for n in ranked
        ],  # fmt: skip
        "cores_busy": {n: per_cell[n]["cores_busy"]["median"] for n in per_cell},
    }
    for k in dict.fromkeys((k_async, 0)):
        ours = f"agent-rl k={k}"
        if ours in per_cell:
            out[ours] = {
                "time_to_goal_s": median_or_none(_times(records, ours, "curve", goal).values()),
                "trl_time_to_goal_s": median_or_none(_times(records, fastest, "curve", goal).values()),
                **_speedups(records, ours, fastest, goal),
            }
    return out


def summarise(records: list[dict], k_async: int, budget_s: float, goal_speedup: float = GOAL_SPEEDUP) -> dict:
    """The summary (see the module docstring); `goal_speedup`: the speed-up the goals ask of agent-rl async."""
    sync = "agent-rl k=0"
    target = {s: TARGET_SHARE * a for s, a in _by_seed(records, sync, "final_accuracy").items()}
    for r in records:
        t = target.get(r["seed"])
        r["target_accuracy"] = t
        r["time_to_target_s"] = None if t is None else time_to(r["curve"], t)
        r["time_to_target_process_s"] = None if t is None else time_to(r["curve_process"], t)
        r["accuracy_at_budget"] = accuracy_at(r["curve"], budget_s)
    names = list(dict.fromkeys(cell_name(r) for r in records))
    per_cell = {}
    for n in names:
        rs = [r for r in records if cell_name(r) == n]
        finals = [r["final_accuracy"] for r in rs]
        per_cell[n] = {
            "runs": len(rs),
            "config": rs[0]["config"],
            "s_per_step": spread(r["s_per_step"] for r in rs),
            "train_seconds": spread(r["train_seconds"] for r in rs),
            "process_wall_s": spread(r["process_wall_s"] for r in rs),
            "cores_busy": spread(r["cores_busy"] for r in rs),
            "final_accuracy_mean": statistics.mean(finals),
            "final_accuracy_std": statistics.pstdev(finals),
            "reached_target": sum(r["time_to_target_s"] is not None for r in rs),
            "time_to_target_s": median_or_none(r["time_to_target_s"] for r in rs),
            "time_to_target_process_s": median_or_none(r["time_to_target_process_s"] for r in rs),
            "accuracy_at_budget_mean": statistics.mean(r["accuracy_at_budget"] for r in rs),
        }
        if "step_split_s" in rs[0]:
            per_cell[n]["step_split_s"] = {
                k: statistics.mean(r["step_split_s"][k] for r in rs) for k in rs[0]["step_split_s"]
            }
    out: dict = {"per_cell": per_cell, "target_share": TARGET_SHARE, "budget_s": budget_s}
    async_name = f"agent-rl k={k_async}"
    k0_step = _by_seed(records, sync, "s_per_step")
    for trl, suffix in TRL_SUFFIX.items():
        if trl not in per_cell:
            continue
        trl_step = _by_seed(records, trl, "s_per_step")
        per_seed = _seed_ratios(k0_step, trl_step)
        out[f"agent_rl_k0_over_trl_s_per_step{suffix}"] = median_or_none(per_seed.values())
        out[f"agent_rl_k0_over_trl_s_per_step{suffix}_per_seed"] = list(per_seed.values())
        per_seed = _seed_ratios(_by_seed(records, async_name, "s_per_step"), trl_step)
        out[f"agent_rl_k{k_async}_over_trl_s_per_step{suffix}"] = median_or_none(per_seed.values())
        # agent-rl async against TRL, to TRL's own final accuracy (paired by seed), training and process time
        trl_final = _by_seed(records, trl, "final_accuracy")
        for axis, key in (("", "curve"), ("_process", "curve_process")):
            own, ours = {}, {}
            for r in records:
                goal = trl_final.get(r["seed"])
                if goal is not None and cell_name(r) == trl:
                    own[r["seed"]] = time_to(r[key], goal)
                elif goal is not None and cell_name(r) == async_name:
                    ours[r["seed"]] = time_to(r[key], goal)
            med, per_seed = median_speedup(own, ours)
            out[f"time_to_trl_final_speedup{axis}{suffix}"] = med
            out[f"time_to_trl_final_speedup{axis}{suffix}_per_seed"] = per_seed
    out["headline"] = headline(records, per_cell, k_async, target)
    trl_steps = {n: c["s_per_step"]["median"] for n, c in per_cell.items() if n.startswith("trl ")}
    if sync in per_cell and trl_steps:
        fastest = min(trl_steps, key=trl_steps.get)
        out["fastest_trl_step_cell"] = fastest
        out["agent_rl_k0_over_fastest_trl_s_per_step"] = (
            per_cell[sync]["s_per_step"]["median"] / trl_steps[fastest]
        )
    k0 = out.get("agent_rl_k0_over_fastest_trl_s_per_step")
    head = (out["headline"] or {}).get(async_name, {})
    train, process = head.get("speedup_train"), head.get("speedup_process")
    out["goals"] = {  # each None when a run did not give its figure
        "agent_rl_k0_step_at_or_under_the_fastest_trl_step": None if k0 is None else k0 <= GOAL_S_PER_STEP,
        f"agent_rl_k{k_async}_{goal_speedup:g}x_sooner_than_the_fastest_trl_cell": None
        if train is None
        else train >= goal_speedup,
        f"agent_rl_k{k_async}_{GOAL_PROCESS:g}x_sooner_in_whole_process_time": None
        if process is None
        else process >= GOAL_PROCESS,
    }
    return out


def versions_line(meta: dict) -> str:
    """' Versions: agent-rl A, TRL T; torch X, transformers Y (TRL's venv: Z where it differs).' where the file
    recorded TRL's venv (files before 3cb3e83 did not); '' where not."""
    trl, ours = meta.get("venvs", {}).get("trl"), meta.get("versions", {})
    if not trl:
        return ""
    both = ("torch", "transformers")
    return (f" Versions: agent-rl {ours.get('agent-rl')}, TRL {trl.get('trl')}; "
            + ", ".join(f"{p} {ours.get(p)}" + ("" if trl.get(p) == ours.get(p) else f" (TRL's venv: {trl.get(p)})")
                        for p in both) + ".")  # fmt: skip


def markdown(out: dict) -> str:
    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    def sp(d, fmt="{:.2f}"):
        return (
            "-" if d["median"] is None else f"{f(d['median'], fmt)} ({f(d['min'], fmt)}-{f(d['max'], fmt)})"
        )

    s = out["summary"]
    k = out["k_async_fixed_before_runs"]
    seeds = lambda xs: ", ".join(f(x) for x in xs)  # noqa: E731
    lines = [
        f"# agent-rl vs TRL GRPOTrainer on agent_arith (one invocation, interleaved; {out.get('model', 'toy model')})",
        "",
        f"`{out['command'].strip()}`, {out['date']}; {out['machine']}. {out['recipe']}, {out['steps']} steps, "
        f"{out['seeds']} seed(s) per cell{planned(out)}, checkpoints every {out['checkpoint_every']} steps scored by agent-rl's "
        f"evaluator on {out['eval_tasks']} held-out tasks; warm start {out['warm_start_accuracy']:.3f}. "
        f"agent-rl async k={k}, fixed before the runs.{versions_line(out.get('meta', {}))}",
        "",
    ]
    lines += headline_lines(out)
    lines += [
        f"- agent-rl k=0 s/step over TRL's (as shipped): {f(s.get('agent_rl_k0_over_trl_s_per_step'))} "
        f"(per seed {seeds(s.get('agent_rl_k0_over_trl_s_per_step_per_seed', []))}); over the fastest TRL cell's "
        f"{f(s.get('agent_rl_k0_over_fastest_trl_s_per_step'))} (goal <= 1.0: "
        f"{s['goals']['agent_rl_k0_step_at_or_under_the_fastest_trl_step']}); against TRL closest loss "
        f"{f(s.get('agent_rl_k0_over_trl_s_per_step_closest'))}; agent-rl k={k} over TRL "
        f"{f(s.get(f'agent_rl_k{k}_over_trl_s_per_step'))}.",
        f"- agent-rl k={k} reaches each TRL cell's own final accuracy sooner by (training time, whole-process time; "
        "0 = never reached): "
        + "; ".join(
            f"{trl} {f(s.get(f'time_to_trl_final_speedup{x}'))}x, {f(s.get(f'time_to_trl_final_speedup_process{x}'))}x "
            f"(per seed {seeds(s.get(f'time_to_trl_final_speedup{x}_per_seed', []))})"
            for trl, x in TRL_SUFFIX.items()
            if f"time_to_trl_final_speedup{x}" in s
        )
        + ".",
        "",
        "| cell | configuration (tuned) | s/step median (min-max) | cores busy | training s | process s | "
        f"final acc mean ± std | time to {int(100 * s['target_share'])}% of k=0 final: training s (process s), reached | "
        f"acc at {s['budget_s']:.0f} training s | agent-rl step split s: wait / learner / weight sync / rest |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in s["per_cell"].items():
        split = c.get("step_split_s")
        split_s = (
            "-"
            if not split
            else " / ".join(f"{split[x]:.2f}" for x in ("wait", "learner", "weight_sync", "rest"))
        )
        lines.append(
            f"| {name} | {c['config']} | {sp(c['s_per_step'])} | {sp(c['cores_busy'])} | "
            f"{sp(c['train_seconds'], '{:.0f}')} | {sp(c['process_wall_s'], '{:.0f}')} | "
            f"{c['final_accuracy_mean']:.3f} ± {c['final_accuracy_std']:.3f} | "
            f"{f(c['time_to_target_s'], '{:.0f}')} ({f(c['time_to_target_process_s'], '{:.0f}')}), "
            f"{c['reached_target']}/{c['runs']} | {c['accuracy_at_budget_mean']:.3f} | {split_s} |"
        )
    lines += [
        "",
        "Per run:",
        "",
        "| cell | seed | s/step | final acc | time to target s | cores busy |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["cells"]:
        lines.append(
            f"| {cell_name(r)} | {r['seed']} | {r['s_per_step']:.2f} | {r['final_accuracy']:.3f} | "
            f"{f(r['time_to_target_s'], '{:.0f}')} | {f(r['cores_busy'])} |"
        )
    t = out["tuning"]
    chosen = {f"{n}: {c['label']}" for n, c in t.get("chosen", {}).items()}
    busy = t.get("cores_busy", {})
    lines += [
        "",
        f"Tuning pass ({t['steps']} steps per candidate, seed 0, "
        + {
            "last half": "median s/step over the last half of the steps",
            "last half, mean": "mean s/step over the last half of the steps",
            "all but the first, mean": "mean s/step over every step but the first (the cells' length)",
        }.get(t.get("timed", ""), "median s/step after the first step")  # fmt: skip
        + (
            ", in this invocation, candidates interleaved; **chosen** in bold"
            if t.get("same_invocation")
            else ""
        )
        + ")"
        + (f"; {t['note']}" if t.get("note") else "")
        + ":",
        "",
    ]
    if not t["median_s_per_step"]:
        lines.append("- none ran in this invocation")
    failed = t.get("failed", {})
    lines += [
        f"- {'**' + n + '**' if n in chosen else n}: "
        + (f"failed ({failed.get(n, 'no time recorded')})" if v is None else f"{v:.2f} s/step")
        + (f", cores busy {busy[n]:.2f}" if busy.get(n) is not None else "")
        for n, v in t["median_s_per_step"].items()
    ]
    lines += [
        "",
        "s/step: median over the run's steps of one optimizer step's wall time (generation or waiting for the batch,",
        "learner, weight push); cores busy: CPU seconds of the run's processes / their wall time; training s: sum of",
        "step times; process s: whole process, start-up and checkpoint writes included. Times to target: the first",
        "scored checkpoint at or above it, medians over seeds (given when most seeds got there). The agent-rl step",
        "split: mean seconds per step waiting for the batch, in the learner, pushing weights, and the rest (logging,",
        "the driver's own work between them).",
        "",
    ]
    return "\n".join(lines)


def planned(out: dict) -> str:
    """' (of N planned: ...)' when the invocation was stopped before all its seeds were run."""
    n = out.get("seeds_planned")
    if not n or n == out["seeds"]:
        return ""
    return (
        f" (of {n} planned: the invocation was stopped before the rest, and only complete seeds are scored)"
    )


def headline_lines(out: dict) -> list[str]:
    """The headline bullet: agent-rl against the fastest TRL cell to the target, cores busy beside each figure
    (nothing for a results file written before the headline existed)."""
    h = out["summary"].get("headline")
    if not h:
        return []

    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    busy = h["cores_busy"]
    ranked = "; ".join(
        f"{c['cell']} {f(c['time_to_target_s'], '{:.0f}')} s ({c['reached']}/{c['runs']} seeds)"
        for c in h["trl_cells_by_time_to_target"]
    )
    lines = []
    k = out["k_async_fixed_before_runs"]
    tuned = out["tuning"].get("same_invocation") and out["tuning"]["steps"] > 0
    head = "Headline: " if tuned else "Not the fair headline (no tuning pass in this invocation): "
    for name, d in ((n, h[n]) for n in h if n.startswith("agent-rl k=")):
        bold = "**" + (head if name == f"agent-rl k={k}" else "")
        lines.append(
            f"- {bold}{name} (cores busy {f(busy[name])}) reaches {h['target']} "
            f"{f(d['speedup_train'])}x sooner than the fastest TRL cell to it, {h['against']} "
            f"({h['against_config']}, cores busy {f(busy[h['against']])})**, in training time (per seed "
            f"{', '.join(f(x) for x in d['speedup_train_per_seed'])}; 0 = never reached; medians "
            f"{f(d['time_to_goal_s'], '{:.0f}')} s vs {f(d['trl_time_to_goal_s'], '{:.0f}')} s); whole-process time "
            f"{f(d['speedup_process'])}x (per seed {', '.join(f(x) for x in d['speedup_process_per_seed'])}); "
            f"CPU time (time to it x cores busy) {f(d['speedup_cpu'])}x "
            f"(per seed {', '.join(f(x) for x in d['speedup_cpu_per_seed'])})."
        )
    lines.append(f"- TRL cells by median training time to the target: {ranked}.")
    return lines


def plot(out: dict, path: Path) -> None:
    model = out.get("model", "tiny model")
    title = f"agent_arith ({model}, 2 cores): agent-rl vs TRL GRPOTrainer, every seed"
    time_curves(out["cells"], cell_name, path, title, "held-out accuracy (agent-rl's evaluator)")
