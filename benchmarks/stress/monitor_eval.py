"""Calibrate and evaluate the collapse early warning (`vcpo.monitor`) on the staleness study's runs.

    .venv/bin/python -m benchmarks.stress.monitor_eval     # -> benchmarks/results/stress/monitor.{json,md}

Runs: level (a) `runs.jsonl.gz` (the fast grid, 250 steps) and, when it exists, level (b)
`runs_b.jsonl.gz` (the full stack, packed by the retired `level_b_report`; docs/studies/staleness.md). Seeds 0-2 are calibration runs,
seeds 3-4 evaluation runs; thresholds are chosen on calibration runs only, per level.

What counts as a collapse, and when accuracy "fell" (the onset):
- level (a): the run failed: its final held-out reward (mean of the last 3 evals) is below half
  of sync's (plain, k = 0, same lr, mean over seeds). Runs here rarely learn and then fall; the
  failed ones fall behind sync and stay there, so the onset is the first eval step from which the
  run stays below half of sync's mean curve at every later eval.
- level (b): the run ended below the warm start (held-out accuracy 0.25, as level_b.md); onset =
  the first eval step from which it stays below the warm start.

Scores (per level; a run warns at the first step the monitor raises a warning):
- recall: collapsed runs warned at least `MIN_LEAD` steps before the onset / collapsed runs;
- precision: collapsed runs that warned at all / runs that warned (a late warning is late, not false);
- lead: onset step - warning step, over collapsed runs that warned.
Calibration picks the thresholds with the best F1 of precision and recall (ties: longer median lead).

The reward watch (`vcpo.monitor.RewardWatch`, the training reward giving back most of its rise) is scored at
the main job's settings (recipes/tiny_tir.yaml's monitor: give-back 0.8, chosen on the main job's runs, not on
these), over every run of each level: it sees a fall after it starts, so its lead is mostly negative and its
recall counts collapsed runs that warned at all.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import statistics as st
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agent_rl.config import load_recipe
from agent_rl.monitor import reward_thresholds
from benchmarks.harness.report import table, write
from benchmarks.stress.signals import first_warning_index, unhealthy_steps
from vcpo.monitor import MonitorThresholds, RewardWatch

OUT = Path("benchmarks/results/stress")
MAIN_JOB = Path(__file__).resolve().parents[2] / "recipes" / "tiny_tir.yaml"
CALIBRATION_SEEDS = (0, 1, 2)
EVALUATION_SEEDS = (3, 4)
MIN_LEAD = 5
LEVEL_B_WARM_START = 0.25
FINAL_EVALS = 3
SIGNALS = ("ess_ratio", "grad_norm", "is_weight_max", "kl")
OFF = math.inf
GRID = {
    "a": {"window": (5, 10, 20, 40), "frac": (0.3, 0.5, 0.7, 0.9)},
    "b": {"window": (3, 5, 8), "frac": (0.3, 0.5, 0.7, 0.9)},
}
ESS_FLOORS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)  # 0: criterion off
GRAD_SPIKES = (2.0, 3.0, 5.0, OFF)
KL_CEILINGS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, OFF)
ABLATIONS = {
    "ESS only": ("ess",),
    "grad norm only": ("grad",),
    "KL only": ("kl",),
    "all": ("ess", "grad", "kl"),
}


@dataclass
class RunSeries:
    """One run's per-step signals (learner steps that updated) and its outcome."""

    level: str
    name: str
    lag: int
    seed: int
    steps: list[int]
    signals: dict[str, list[float]]
    collapsed: bool
    onset: int | None  # step from which held-out accuracy stayed down (collapsed runs)
    rewards: list[float] = field(default_factory=list)  # the training batch's mean reward, step by step


@dataclass
class Score:
    runs: int
    collapsed: int
    warned: int
    true_warned: int  # collapsed runs that warned at all
    in_time: int  # ... at least MIN_LEAD steps before the onset
    false_alarms: int
    leads: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, runs: list[RunSeries]) -> Score:
        return cls(len(runs), sum(r.collapsed for r in runs), 0, 0, 0, 0)

    def count(self, run: RunSeries, step: int) -> None:
        """`run` warned first at `step`: a false alarm, or a collapse caught with its lead to the onset."""
        self.warned += 1
        if not run.collapsed:
            self.false_alarms += 1
            return
        assert run.onset is not None
        lead = run.onset - step
        self.true_warned += 1
        self.leads.append(lead)
        self.in_time += lead >= MIN_LEAD

    @property
    def precision(self) -> float:
        return self.true_warned / self.warned if self.warned else 0.0

    @property
    def recall(self) -> float:
        return self.in_time / self.collapsed if self.collapsed else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def row(self) -> dict:
        return asdict(self) | {"precision": self.precision, "recall": self.recall, "f1": self.f1}


def _onset(steps: list[int], values: list[float], floor: list[float]) -> int:
    """First eval step from which every later value is below its floor (the last step if none)."""
    onset = steps[-1]
    for i in range(len(steps) - 1, -1, -1):
        if values[i] >= floor[i]:
            break
        onset = steps[i]
    return onset


def _read_jsonl_gz(path: Path) -> list[dict]:
    return [
        json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()
    ]


def level_a_runs(path: Path) -> list[RunSeries]:
    runs = _read_jsonl_gz(path)
    sync: dict[float, list[list[float]]] = defaultdict(list)
    for r in runs:
        c = r["config"]
        if c["method"] == "plain" and c["lag"] == 0 and not r["error"]:
            sync[c["lr"]].append(r["heldout_reward"])
    out = []
    for r in runs:
        c = r["config"]
        curve = [st.fmean(col) for col in zip(*sync[c["lr"]], strict=True)]
        half = [0.5 * x for x in curve]
        h = r["heldout_reward"]
        failed = bool(r["error"]) or st.fmean(h[-FINAL_EVALS:]) < 0.5 * st.fmean(curve[-FINAL_EVALS:])
        n = len(r["ess_ratio"])
        out.append(
            RunSeries(
                level="a", name=f"{c['method']}[{c['opob_mode']}] k={c['lag']} lr={c['lr']}", lag=c["lag"], seed=c["seed"],
                steps=list(range(n)), signals={s: r[s] for s in SIGNALS}, collapsed=failed,
                onset=_onset([v - 1 for v in r["eval_steps"]], h, half) if failed else None,  # eval at version v: after step v-1
                rewards=r["train_reward"],
            )
        )  # fmt: skip
    return out


def policy_curve(run: dict) -> tuple[list[int], list[float]]:
    """A level (b) run's held-out curve against the learner step whose policy was evaluated: under fixed_lag=k the
    periodic eval runs on the engines, which hold the policy of step t-k after step t (-1: the warm start); the final
    checkpoint's eval, when there is one, is the policy of the last step."""
    steps = [max(-1, t - run["lag"]) for t in run["eval_steps"]]
    accs = list(run["eval_accuracy"])
    if run.get("final_accuracy") is not None:
        steps.append(run["steps"][-1] if run["steps"] else run["eval_steps"][-1])
        accs.append(run["final_accuracy"])
    return steps, accs


def final_accuracy(run: dict) -> float:
    """The learner's policy at the last step; without a final checkpoint eval, the last periodic eval."""
    final = run.get("final_accuracy")
    return run["eval_accuracy"][-1] if final is None else final


def level_b_runs(path: Path) -> list[RunSeries]:
    out = []
    for r in _read_jsonl_gz(path):
        evs, acc = policy_curve(r)  # against the learner step evaluated (fixed_lag evals are k steps old)
        collapsed = final_accuracy(r) < LEVEL_B_WARM_START
        out.append(
            RunSeries(
                level="b", name=f"{r['method']} k={r['lag']}", lag=r["lag"], seed=r["seed"], steps=r["steps"],
                signals={s: r[s] for s in SIGNALS}, collapsed=collapsed,
                onset=_onset(evs, acc, [LEVEL_B_WARM_START] * len(acc)) if collapsed else None,
                rewards=r["train_reward"],
            )
        )  # fmt: skip
    return out


class Batch:
    """Every run of a set padded into [runs, steps] arrays (padding: healthy steps that never warn)."""

    def __init__(self, runs: list[RunSeries]):
        self.runs = runs
        n = max(len(r.steps) for r in runs)
        pad = {"ess_ratio": 1.0, "grad_norm": 0.0, "is_weight_max": 1.0, "kl": 0.0}
        self.arr = {
            s: np.array([r.signals[s] + [pad[s]] * (n - len(r.steps)) for r in runs], dtype=float)
            for s in SIGNALS
        }
        self.steps = [r.steps for r in runs]

    def score(self, th: MonitorThresholds) -> Score:
        first = first_warning_index(th, unhealthy_steps(th, *(self.arr[s] for s in SIGNALS)))
        sc = Score.of(self.runs)
        for r, steps, i in zip(self.runs, self.steps, first, strict=True):
            if 0 <= i < len(steps):
                sc.count(r, steps[i])
        return sc

    def first_warnings(self, th: MonitorThresholds) -> list[int | None]:
        first = first_warning_index(th, unhealthy_steps(th, *(self.arr[s] for s in SIGNALS)))
        return [steps[i] if 0 <= i < len(steps) else None for steps, i in zip(self.steps, first, strict=True)]


def candidates(level: str, use: tuple[str, ...]) -> list[MonitorThresholds]:
    out = []
    g = GRID[level]
    for window, frac, ess, spike, kl in itertools.product(
        g["window"], g["frac"], ESS_FLOORS if "ess" in use else (0.0,),
        GRAD_SPIKES if "grad" in use else (OFF,), KL_CEILINGS if "kl" in use else (OFF,),
    ):  # fmt: skip
        if ess == 0.0 and spike == OFF and kl == OFF:
            continue
        out.append(
            MonitorThresholds(
                window=window, min_unhealthy=max(1, math.ceil(frac * window)), warmup=min(5, window),
                ess_floor=ess, grad_spike=spike, kl_ceiling=kl,
            )
        )  # fmt: skip
    return out


def calibrate(batch: Batch, level: str, use: tuple[str, ...]) -> tuple[MonitorThresholds, Score]:
    def key(item: tuple[MonitorThresholds, Score]) -> tuple[float, float]:
        sc = item[1]
        return (round(sc.f1, 6), st.median(sc.leads) if sc.leads else -1e9)

    return max(((th, batch.score(th)) for th in candidates(level, use)), key=key)


def _lead_text(sc: Score) -> str:
    if not sc.leads:
        return "-"
    return f"median {st.median(sc.leads):g}, min {min(sc.leads)}, max {max(sc.leads)}"


def _th_text(th: MonitorThresholds) -> str:
    parts = [f"window {th.window}", f"min_unhealthy {th.min_unhealthy}", f"warmup {th.warmup}"]
    if th.ess_floor > 0:
        parts.append(f"ess_floor {th.ess_floor:g}")
    if th.grad_spike != OFF:
        parts.append(f"grad_spike {th.grad_spike:g}")
    if th.kl_ceiling != OFF:
        parts.append(f"kl_ceiling {th.kl_ceiling:g}")
    return ", ".join(parts)


def lag_baseline(cal: list[RunSeries], ev: list[RunSeries]) -> dict:
    """The trivial predictor the signals must beat: "collapses iff k >= K" (K chosen on calibration runs),
    warning at step 0. The monitor's signals grow with k, so part of what they see is the lag itself."""

    def score(runs: list[RunSeries], k_min: int) -> Score:
        sc = Score.of(runs)
        for r in (r for r in runs if r.lag >= k_min):
            sc.count(r, r.steps[0])  # warned at once
        return sc

    best = max(sorted({r.lag for r in cal} - {0}), key=lambda k: score(cal, k).f1)
    return {"k_min": best, "calibration": score(cal, best).row(), "evaluation": score(ev, best).row()}


def reward_watch(runs: list[RunSeries]) -> dict:
    """The reward watch at the main job's thresholds over `runs`: who warned, and when against the onset."""
    th = reward_thresholds(load_recipe(MAIN_JOB).monitor)
    sc = Score.of(runs)
    for r in runs:
        watch = RewardWatch(th)
        first = next((i for i, x in enumerate(r.rewards) if watch.update(i, x, i) is not None), None)
        if first is not None:
            sc.count(r, r.steps[first] if first < len(r.steps) else first)
    return {"thresholds": asdict(th)} | sc.row()


def split_seeds(runs: list[RunSeries]) -> tuple[list[int], list[int]]:
    """Calibration and evaluation seeds: 0-2 vs 3-4; with fewer seeds, the last seed is the evaluation one."""
    seeds = sorted({r.seed for r in runs})
    ev = [s for s in seeds if s in EVALUATION_SEEDS] or seeds[-1:]
    return [s for s in seeds if s not in ev], ev


def evaluate(levels: dict[str, list[RunSeries]]) -> dict:
    result: dict = {"min_lead": MIN_LEAD}
    for level, runs in levels.items():
        cal_seeds, ev_seeds = split_seeds(runs)
        cal = Batch([r for r in runs if r.seed in cal_seeds])
        ev = Batch([r for r in runs if r.seed in ev_seeds])
        entry: dict = {
            "runs": len(runs), "collapsed": sum(r.collapsed for r in runs), "calibration_seeds": cal_seeds,
            "evaluation_seeds": ev_seeds, "ablations": {},
        }  # fmt: skip
        for name, use in ABLATIONS.items():
            th, cal_score = calibrate(cal, level, use)
            ev_score = ev.score(th)
            entry["ablations"][name] = {
                "thresholds": asdict(th), "calibration": cal_score.row(), "evaluation": ev_score.row(),
            }  # fmt: skip
            if name == "all":
                entry["per_run"] = [
                    {"name": r.name, "seed": r.seed, "collapsed": r.collapsed, "onset": r.onset, "warned": w}
                    for r, w in zip(ev.runs, ev.first_warnings(th), strict=True)
                ]
        entry["lag_only"] = lag_baseline(cal.runs, ev.runs)
        entry["reward_watch"] = reward_watch(runs)
        mixed = sorted({r.lag for r in runs if r.collapsed} & {r.lag for r in runs if not r.collapsed})
        th = MonitorThresholds(**entry["ablations"]["all"]["thresholds"])
        entry["within_lag"] = {
            str(k): Batch([r for r in ev.runs if r.lag == k]).score(th).row()
            for k in mixed
            if any(r.lag == k for r in ev.runs)
        }
        result[level] = entry
    if "a" in levels and "b" in levels:  # transfer: level (a)'s thresholds on level (b)'s evaluation runs
        th = MonitorThresholds(**result["a"]["ablations"]["all"]["thresholds"])
        ev = Batch([r for r in levels["b"] if r.seed in result["b"]["evaluation_seeds"]])
        result["a_thresholds_on_b"] = ev.score(th).row()
    return result


def markdown(result: dict) -> str:
    lines = [
        "# Collapse early warning: calibration and evaluation (`python -m benchmarks.stress.monitor_eval`)",
        "",
        "Thresholds are chosen on calibration runs (seeds 0-2) and scored on evaluation runs (seeds 3-4). "
        f"Recall counts a collapsed run only if it warned >= {MIN_LEAD} steps before held-out accuracy fell; "
        "precision = collapsed runs that warned / runs that warned. Definitions: module docstring of "
        "benchmarks/stress/monitor_eval.py.",
        "",
    ]
    names = {
        "a": "level (a): fast grid (GRU, 250 steps)",
        "b": "level (b): full stack (tiny_arith, 40 steps)",
    }
    for level in ("a", "b"):
        if level not in result:
            continue
        e = result[level]
        lines += [
            f"## {names[level]}: {e['runs']} runs, {e['collapsed']} collapsed",
            "",
            f"Calibration seeds {e['calibration_seeds']}, evaluation seeds {e['evaluation_seeds']}.",
            "",
        ]
        rows = []
        for name, a in e["ablations"].items():
            c, v = a["calibration"], a["evaluation"]
            rows.append([name, _th_text(MonitorThresholds(**a["thresholds"])), f"{c['precision']:.2f} / {c['recall']:.2f}",
                         f"{v['precision']:.2f}", f"{v['recall']:.2f} ({v['in_time']}/{v['collapsed']})",
                         _lead_text(Score(**{k: v[k] for k in Score.__dataclass_fields__})),
                         f"{v['warned']} / {v['collapsed']} / {v['false_alarms']}"])  # fmt: skip
        lag, cal_lag = e["lag_only"]["evaluation"], e["lag_only"]["calibration"]
        rows.append([f"lag only: k >= {e['lag_only']['k_min']} (no signals)", "-",
                     f"{cal_lag['precision']:.2f} / {cal_lag['recall']:.2f}", f"{lag['precision']:.2f}",
                     f"{lag['recall']:.2f} ({lag['in_time']}/{lag['collapsed']})", "-",
                     f"{lag['warned']} / {lag['collapsed']} / {lag['false_alarms']}"])  # fmt: skip
        lines += table(["signals", "thresholds (chosen on calibration runs)", "calib. precision / recall",
                        "eval. precision", "eval. recall", "eval. lead (steps)", "eval. warned / collapsed / false alarms"], rows)  # fmt: skip
        lines += ["", "Within one lag (evaluation runs at each k where some runs collapsed and some did not; the lag "
                  "alone cannot separate these), thresholds of the 'all' row:", ""]  # fmt: skip
        lines += table(["k", "runs", "collapsed", "precision", "recall", "false alarms"],
                       [[k, w["runs"], w["collapsed"], f"{w['precision']:.2f}", f"{w['recall']:.2f} ({w['in_time']}/"
                         f"{w['collapsed']})", w["false_alarms"]] for k, w in e["within_lag"].items()])  # fmt: skip
        if "reward_watch" in e:
            w = e["reward_watch"]
            th = w["thresholds"]
            lines += ["", f"The reward watch (the training reward's moving average, smoothing {th['smoothing']:g}, giving "
                      f"back {th['giveback']:g} of its rise of at least {th['min_rise']:g}; the main job's settings) over all "
                      f"{w['runs']} runs: warned on {w['true_warned']} of {w['collapsed']} collapsed runs, "
                      f"{w['false_alarms']} of the {w['runs'] - w['collapsed']} others; lead "
                      f"{_lead_text(Score(**{k: w[k] for k in Score.__dataclass_fields__}))} (negative: after the "
                      "onset)."]  # fmt: skip
        lines.append("")
    if "a_thresholds_on_b" in result:
        t = result["a_thresholds_on_b"]
        lines += [
            f"Level (a)'s thresholds on level (b)'s evaluation runs: precision {t['precision']:.2f}, recall "
            f"{t['recall']:.2f} ({t['in_time']}/{t['collapsed']}), {t['false_alarms']} false alarms.",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    levels = {"a": level_a_runs(args.out / "runs.jsonl.gz")}
    if (args.out / "runs_b.jsonl.gz").exists():
        levels["b"] = level_b_runs(args.out / "runs_b.jsonl.gz")
    result = json.loads(json.dumps(evaluate(levels), default=float))  # numpy numbers as the JSON writes them
    write("monitor", result, args.out, lambda r: markdown(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
