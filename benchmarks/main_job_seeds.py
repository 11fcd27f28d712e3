"""The main job over seeds, learner on the CPU and on a GPU: does it learn as much on both?

    PYTHONPATH=. .venv/bin/python benchmarks/main_job_seeds.py [--devices cpu cuda] [--seeds 0 1 2]
        [--bare] [--time-limit-s S] [--out DIR]

Each (device, seed) is one run of `python -m examples.tiny_tir` (the README's main job, recipes/tiny_tir.yaml)
with `--set train.seed=SEED --set learner.device=DEVICE` under its own name (runs/main_job_DEVICE_sSEED), all
from one SFT warm start (the recipe's model.path, runs/tiny_tir/sft: built by the first run that finds none,
then shared, so the seeds differ in the RL run alone). The embedded engine samples on the CPU in every cell (it
has no CUDA path); `cuda` moves the learner. Recorded per run: held-out accuracy before and after RL (100
tasks), the gain, the run's wall seconds, the device's name and the torch version.

The runs go through the benchmark harness (benchmarks/harness): seed-major, cells rotated; each finished run is
a line of WORK/runs.jsonl, so an invocation cut short (or run on another machine: bring its runs.jsonl into
WORK) resumes where it stopped, and `--time-limit-s` drains (no run is cut half-way). Reported: each device's
gain as mean ± SE over seeds, and cuda − cpu with the 2-SE words (issue 63: "learns as on CPU" = the gains
within 2 SE).

--bare is for a machine without bubblewrap (the lent GPU machine): the tool calls run in a plain subprocess (the
env spec copied into WORK with only its sandbox backend changed, to unsafe-subprocess).
Writes benchmarks/results/main_job_seeds.{json,md} (a run with --out writes there instead).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks.harness.provenance import ROOT, Provenance  # noqa: E402
from benchmarks.harness.report import RESULTS, table, write  # noqa: E402
from benchmarks.harness.runner import Job, Runner, plan, read_runs  # noqa: E402
from benchmarks.harness.stats import difference, mean_se  # noqa: E402
from benchmarks.harness.train import run_logged  # noqa: E402

NAME = "main_job_seeds"
WORK = ROOT / "runs" / "bench" / NAME
ENV_SPEC = ROOT / "envs" / "tiny_arith.yaml"


def unsafe_env_spec(work: Path) -> Path:
    """The main job's env spec with the sandbox switched to a plain subprocess (nothing else changed)."""
    spec = yaml.safe_load(ENV_SPEC.read_text())
    spec["sandbox"]["backend"] = "unsafe-subprocess"
    spec["sandbox"]["options"] = {**spec["sandbox"].get("options", {}), "allow_unsafe": True}
    path = work / "tiny_arith_unsafe.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_one(job: Job, env_spec: Path | None, logs: Path) -> dict:
    """One main job: its report's accuracies, the gain, the wall time; its output in logs/CELL_sSEED.log."""
    name = f"main_job_{job.cell}_s{job.seed}"
    sets = [f"name={name}", f"train.seed={job.seed}", f"learner.device={job.cell}"]
    if env_spec is not None:  # --bare
        sets.append(f"envs.train={env_spec}")
    cmd = [sys.executable, "-m", "examples.tiny_tir", "--fresh"]
    for s in sets:
        cmd += ["--set", s]
    seconds = run_logged(cmd, logs / f"{job.cell}_s{job.seed}.log", f"{NAME}: {job.key}")
    report = json.loads((ROOT / "runs" / name / "report.json").read_text())
    before, after = report["before"]["accuracy"], report["after"]["accuracy"]
    import torch

    device = torch.cuda.get_device_name(0) if job.cell == "cuda" else "cpu"
    return {
        "before": before, "after": after, "gain": after - before, "seconds": round(seconds, 1),
        "device_name": device, "torch": torch.__version__,
    }  # fmt: skip


def summarize(records: list[dict], devices: list[str]) -> dict:
    by = {d: [r for r in records if r["cell"] == d] for d in devices}
    cells = {}
    for d, rs in by.items():
        g = mean_se(r["gain"] for r in rs)
        cells[d] = {
            "seeds": [r["seed"] for r in rs], "gain_mean": g.mean, "gain_se": g.se,
            "before_mean": mean_se(r["before"] for r in rs).mean, "after_mean": mean_se(r["after"] for r in rs).mean,
            "seconds_mean": mean_se(r["seconds"] for r in rs).mean,
            "device_names": sorted({r["device_name"] for r in rs}), "torch": sorted({r["torch"] for r in rs}),
        }  # fmt: skip
    out: dict = {"cells": cells}
    if "cpu" in by and "cuda" in by:
        gap = difference(mean_se(r["gain"] for r in by["cuda"]), mean_se(r["gain"] for r in by["cpu"]))
        out["cuda_minus_cpu"] = {
            "diff": gap.diff,
            "se": gap.se,
            "text": gap.text(),
            "separated": gap.separated,
        }
    return out


def render(data: dict) -> str:
    meta = data["meta"]
    lines = [
        "# The main job over seeds, learner on the CPU and on a GPU",
        "",
        f"`{meta['command']}`; {meta['date']}, commit {meta['commit']}, load {meta['load_before']} before, "
        f"{meta['load_after']} after (this invocation's machine; each run's device is in its row).",
        "",
    ]
    rows = [
        (d, ", ".join(c["device_names"]), len(c["seeds"]), f"{c['before_mean']:.2f}", f"{c['after_mean']:.2f}",
         f"{c['gain_mean']:+.2f}" + (f" ± {c['gain_se']:.2f}" if c["gain_se"] is not None else ""),
         f"{c['seconds_mean']:.0f}")
        for d, c in data["summary"]["cells"].items() if c["seeds"]
    ]  # fmt: skip
    lines += table(["learner", "device", "seeds", "before", "after", "gain (mean ± SE)", "s / run"], rows)
    gap = data["summary"].get("cuda_minus_cpu")
    if gap and gap["diff"] is not None:
        words = {
            True: "separated: the GPU run learns a different amount",
            False: "within 2 SE: learns as on CPU",
        }
        lines += ["", f"cuda − cpu gain: {gap['text']} ({words.get(gap['separated'], 'no spread yet')})."]
    if data["missing"]:
        lines += ["", "Not run (time limit): " + ", ".join(data["missing"])]
    lines += ["", "| run | before | after | seconds |", "|---|---|---|---|"]
    lines += [
        f"| {r['cell']} seed {r['seed']} | {r['before']:.2f} | {r['after']:.2f} | {r['seconds']} |"
        for r in data["runs"]
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", nargs="+", choices=["cpu", "cuda"], default=["cpu", "cuda"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--bare", action="store_true", help="no bubblewrap here: tool calls in a plain subprocess")
    p.add_argument("--time-limit-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument(
        "--work", type=Path, default=WORK, help=f"runs.jsonl and logs (default {WORK.relative_to(ROOT)})"
    )
    p.add_argument(
        "--out", type=Path, default=None, help=f"results folder (default {RESULTS.relative_to(ROOT)})"
    )
    args = p.parse_args(argv)
    done = read_runs(args.work / "runs.jsonl")
    if any(f"cuda@{s}" not in done for s in args.seeds if "cuda" in args.devices):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(
                f"{NAME}: --devices cuda needs a GPU here, or its runs in {args.work}/runs.jsonl from a machine with one"
            )
    prov = Provenance()
    logs = args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env_spec = unsafe_env_spec(args.work) if args.bare else None
    outcome = Runner(args.work, args.time_limit_s).run(
        plan(args.devices, args.seeds), lambda job: run_one(job, env_spec, logs)
    )
    data = {
        "meta": prov.meta(),
        "devices": args.devices,
        "seeds": args.seeds,
        "summary": summarize(outcome.records, args.devices),
        "missing": [j.key for j in outcome.missing],
        "runs": outcome.records,
    }
    write(NAME, data, args.out or RESULTS, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
