"""Asynchronous (k=2, k=8) versus synchronous (k=0) training of the same recipe, in one invocation.

    .venv/bin/python benchmarks/async_vs_sync.py [--task digits|tiny_arith] [--steps 40] [--ks 0,2,8]

Every run: recipes/tiny_tir_smoke.yaml (embedded CPU engine, local sandbox, torch learner, VCPO),
4 prompts x 8 samples per step, the same start model, periodic eval; only k differs. Reported
per run: wall time per step, learner busy fraction (share of each step spent in learner.step),
engine busy fraction (share of wall time with a generate request in flight), the eval reward
curve, and the wall time until eval reward first reaches the target. Ratios are against k=0 from
the same invocation. Writes benchmarks/results/async_vs_sync.json and .md.

Tasks:
- digits (default): tiny_arith prompts, a random tiny model, and a dense reward (share of digits
  in the response). Synthetic, but the policy learns it within tens of steps on CPU, so "time to
  target" is measurable here.
- tiny_arith: the real task with its 0/1 reward, from an SFT warm start on the scripted teacher's
  traces (tool used 30% of the time); target = warm-start eval accuracy + --gain. On this CPU the
  tiny warm start is weak (a few % accuracy) and rarely reaches the target in a short run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
RECIPE = ROOT / "recipes" / "tiny_tir_smoke.yaml"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warm_start(work: Path, n_traces: int) -> Path:
    """Tiny model + SFT on teacher traces; returns the SFT model dir (reused if already there)."""
    from agent_rl.sft import run_sft
    from agent_rl.tiny import build_tiny
    from envs.tiny_arith import corpus, teacher_traces

    sft_dir = work / "sft"
    if (sft_dir / "config.json").is_file():
        return sft_dir
    base = build_tiny(work / "base", corpus(), vocab_size=512, seed=0, hidden=128, layers=2)
    rows = []
    for tr in teacher_traces(n_traces, seed=7, tool_rate=0.3):
        pieces = [
            {
                "text": s.text if s.kind == "model" else f"```output\n{s.text}\n```\n",
                "train": s.kind == "model",
            }
            for s in tr.segments
        ]
        rows.append({"prompt": tr.prompt, "response": pieces})
    data = work / "teacher.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_sft(base, data, sft_dir, epochs=3, lr=2e-3, batch_size=32, max_len=256, progress=False)


def digit_share(text: str, task: object) -> float:
    """The digits task's reward: share of digit characters in the response (0..1)."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def digits_env(work: Path) -> Path:
    """envs/tiny_arith.yaml with short budgets and the dense reward above (void turns trained, not masked)."""
    import yaml

    spec = yaml.safe_load((ROOT / "envs" / "tiny_arith.yaml").read_text())
    spec["name"] = "tiny_arith_digits"
    spec["turns"] = {"max_turns": 2, "max_tokens_per_turn": 24, "max_response_tokens": 48}
    spec["reward"] = {"type": "callable", "import_path": "async_vs_sync:digit_share"}
    spec["group_size"] = 8
    path = work / "tiny_arith_digits.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def task_overrides(task: str, work: Path) -> list[str]:
    if task == "digits":
        return [f"envs.train={digits_env(work)}", "buffer.mask_void=false"]
    return []


def random_model(work: Path) -> Path:
    from agent_rl.tiny import build_tiny
    from envs.tiny_arith import corpus

    if (work / "random" / "config.json").is_file():
        return work / "random"
    return build_tiny(work / "random", corpus(), vocab_size=512, seed=0, hidden=128, layers=2)


def run(
    model: Path, work: Path, k: int, steps: int, eval_every: int, eval_limit: int, lr: float, extra: list[str]
) -> list[dict]:
    from agent_rl.config import load_recipe
    from agent_rl.metrics import read_metrics
    from agent_rl.trainer import train

    run_dir = work / f"k{k}"
    recipe = load_recipe(
        RECIPE,
        [
            f"model.path={model}",
            f"logging.run_dir={run_dir}",
            f"buffer.max_staleness={k}",
            f"train.steps={steps}",
            "train.batch_prompts=4",
            f"learner.lr={lr}",
            "checkpoint.every=0",
            f"eval.every={eval_every}",
            f"eval.limit={eval_limit}",
            *extra,
        ],
    )
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    train(recipe)
    return read_metrics(run_dir)


def baseline_accuracy(model: Path, work: Path, eval_limit: int, extra: list[str]) -> float:
    from agent_rl.config import load_recipe
    from agent_rl.evaluate import evaluate

    recipe = load_recipe(
        RECIPE,
        [f"model.path={model}", f"logging.run_dir={work / 'eval0'}", f"eval.limit={eval_limit}", *extra],
    )
    return evaluate(recipe).accuracy


def summarise(records: list[dict], target: float) -> dict:
    steps = [r for r in records if "perf/step_seconds" in r]
    evals = [r for r in records if "eval/accuracy" in r]
    hit = next((r for r in evals if r["eval/accuracy"] >= target), None)
    # perf/step_seconds excludes the periodic eval (identical work in every run, not part of the comparison)
    train_s = [r["perf/step_seconds"] for r in steps]
    return {
        "steps": len(steps),
        "wall_seconds": records[-1]["time"],
        "seconds_per_step": statistics.mean(train_s),
        "learner_busy_fraction": statistics.mean(r["perf/learner_busy_fraction"] for r in steps),
        "engine_busy_fraction": statistics.mean(r["perf/engine_busy_fraction"] for r in steps),
        "staleness_mean": statistics.mean(r.get("buffer/staleness_mean", 0.0) for r in steps),
        "dropped_stale": records[-1]["buffer/dropped_stale"],
        "ess_ratio_mean": statistics.mean(r["vcpo/ess_ratio"] for r in steps),
        "eval_accuracy": [(r["step"], round(r["eval/accuracy"], 4)) for r in evals],
        "final_eval_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "seconds_to_target": None if hit is None else hit["time"],
        "step_to_target": None if hit is None else hit["step"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=("digits", "tiny_arith"), default="digits")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ks", default="0,2,8")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-limit", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="default: 3e-3 (digits), 2e-4 (tiny_arith)")
    p.add_argument("--target", type=float, default=0.5, help="digits: eval reward to reach")
    p.add_argument("--gain", type=float, default=0.05, help="tiny_arith: target = warm-start accuracy + gain")
    p.add_argument(
        "--traces", type=int, default=3000, help="tiny_arith: teacher traces for the SFT warm start"
    )
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_async_vs_sync")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    ks = [int(k) for k in args.ks.split(",")]
    if ks[0] != 0:
        raise SystemExit("--ks must start with 0: the synchronous run is the baseline of every ratio")
    lr = args.lr if args.lr is not None else (3e-3 if args.task == "digits" else 2e-4)
    extra = task_overrides(args.task, args.work)
    if args.task == "digits":
        model = random_model(args.work)
    else:
        log("warm start: tiny model + SFT on teacher traces")
        model = warm_start(args.work, args.traces)
    base_acc = baseline_accuracy(model, args.work, args.eval_limit, extra)
    target = args.target if args.task == "digits" else base_acc + args.gain
    log(f"{args.task}: start eval reward {base_acc:.3f}; target {target:.3f}")
    results = {}
    for k in ks:
        log(f"k={k}: {args.steps} steps")
        results[k] = summarise(
            run(model, args.work, k, args.steps, args.eval_every, args.eval_limit, lr, extra), target
        )
        log(f"k={k}: {json.dumps(results[k])}")

    base = results[0]
    for r in results.values():
        r["step_time_ratio_vs_k0"] = r["seconds_per_step"] / base["seconds_per_step"]
        r["speedup_vs_k0"] = base["seconds_per_step"] / r["seconds_per_step"]
        both = r["seconds_to_target"] is not None and base["seconds_to_target"] is not None
        r["time_to_target_ratio_vs_k0"] = r["seconds_to_target"] / base["seconds_to_target"] if both else None
    out = {
        "command": " ".join(["benchmarks/async_vs_sync.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
        "steps": args.steps,
        "lr": lr,
        "task": args.task,
        "batch": "4 prompts x 8 samples, embedded CPU engine, local sandbox, torch learner, VCPO",
        "warm_start_eval_accuracy": base_acc,
        "target_eval_accuracy": target,
        "runs": {f"k={k}": r for k, r in results.items()},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "async_vs_sync.json").write_text(json.dumps(out, indent=2) + "\n")
    (OUT / "async_vs_sync.md").write_text(markdown(out))
    print(markdown(out))
    return 0


def markdown(out: dict) -> str:
    def f(x: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if x is None else fmt.format(x)

    lines = [
        "# Async (k>0) vs sync (k=0) training, same recipe, one invocation",
        "",
        f"`{out['command']}` on {out['machine']}; task {out['task']}; {out['steps']} steps at lr {out['lr']:g}; "
        f"{out['batch']}.",
        f"Eval reward of the start model {out['warm_start_eval_accuracy']:.3f}; target {out['target_eval_accuracy']:.3f}.",
        "",
        "| run | s/step | speed-up vs k=0 | learner busy | engine busy | staleness | ESS ratio | final eval reward | "
        "time to target (s) | vs k=0 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in out["runs"].items():
        lines.append(
            f"| {name} | {f(r['seconds_per_step'])} | {f(r['speedup_vs_k0'])}x | {f(r['learner_busy_fraction'])} | "
            f"{f(r['engine_busy_fraction'])} | {f(r['staleness_mean'])} | {f(r['ess_ratio_mean'], '{:.3f}')} | "
            f"{f(r['final_eval_accuracy'], '{:.3f}')} | {f(r['seconds_to_target'], '{:.0f}')} | "
            f"{f(r['time_to_target_ratio_vs_k0'])} |"
        )
    lines += [
        "",
        "s/step: wall time of take + learner step + weight sync, averaged over steps (periodic eval excluded).",
        "Learner busy: share of a step spent in learner.step; engine busy: share of wall time with a request in flight.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
