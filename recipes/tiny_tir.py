"""The CPU main job, end to end: tiny model from scratch -> SFT warm start -> async VCPO RL -> report.

Each stage is one agent-rl call (the same functions `agent-rl tiny-model | sft | eval | train`
run) and is skipped when its output already exists, so an interrupted run picks up where it
stopped. Run: `python -m recipes.tiny_tir [--fresh]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from agent_rl.config import load_recipe
from agent_rl.evaluate import EvalReport, evaluate
from agent_rl.plot import plot_run
from agent_rl.sft import run_sft
from agent_rl.tiny import build_tiny
from agent_rl.trainer import train
from envs.tiny_arith import corpus, sft_row, teacher_traces

RECIPE = Path(__file__).with_name("tiny_tir.yaml")
# Warm start: the teacher uses the tool on 30% of the hard problems and guesses on the rest. The
# drill traces (all tool use, first token context-only) teach the tool branch itself, copying the
# expression into print(...) and the output into \boxed{}, without moving the 30% decision.
SFT_TRACES, SFT_DRILL, SFT_TOOL_RATE, SFT_SEED, SFT_DRILL_SEED = 3000, 3000, 0.3, 7, 8
SFT = dict(epochs=2, lr=2e-3, batch_size=16, max_len=128, warmup_steps=10)
MODEL = dict(vocab_size=512, hidden=256, layers=2, heads=4, kv_heads=2)


def _stage(name: str) -> None:
    print(f"\n=== {name} [{time.strftime('%H:%M:%S')}]", flush=True)


def write_sft_data(path: Path) -> None:
    """Decision traces (tool on SFT_TOOL_RATE of hard problems) plus tool-branch drills, shuffled by the SFT."""
    rows = [sft_row(tr) for tr in teacher_traces(SFT_TRACES, seed=SFT_SEED, tool_rate=SFT_TOOL_RATE)]
    drills = teacher_traces(SFT_DRILL, seed=SFT_DRILL_SEED, tool_rate=1.0, easy_fraction=0.0)
    rows += [sft_row(tr, train_first_token=False) for tr in drills]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def report(before: EvalReport, after: EvalReport, run_dir: Path, curves: Path, seconds: float) -> str:
    rows = [
        ("accuracy", before.accuracy, after.accuracy),
        ("tool-use rate", before.tool_use_rate, after.tool_use_rate),
        ("turns / episode", before.turns_per_episode, after.turns_per_episode),
        ("tokens / s (eval)", before.tokens_per_s, after.tokens_per_s),
    ]
    lines = [f"tiny_tir: held-out {after.env}/{after.split}, {after.tasks} tasks", ""]
    lines.append(f"{'':20s} {'warm start':>12s} {'after RL':>12s}")
    lines += [f"{name:20s} {b:12.3f} {a:12.3f}" for name, b, a in rows]
    gain = 100 * (after.accuracy - before.accuracy)
    lines += ["", f"accuracy gain: {gain:+.1f} points; total {seconds / 60:.1f} min", f"curves: {curves}"]
    lines.append(f"run dir: {run_dir}")
    lines.append(
        f"trajectories: agent-rl view {run_dir}  (writes {run_dir / 'view.html'}, open it in a browser)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fresh", action="store_true", help="delete runs/tiny_tir first")
    args = p.parse_args(argv)
    t0 = time.time()
    # One torch thread: the model's matrices are too small to gain from a second core, and two threads
    # slow down several-fold whenever the sandbox or anything else on the machine wants a core.
    torch.set_num_threads(1)
    recipe = load_recipe(RECIPE)
    root = recipe.run_dir
    if args.fresh:
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    base, sft_dir = root / "base", Path(recipe.model.path)

    _stage("1/5 build tokenizer + Qwen2 model from scratch")
    if not (base / "config.json").is_file():
        build_tiny(base, corpus(), seed=0, **MODEL)
    _stage("2/5 SFT warm start on teacher traces (tool used on 30% of hard problems)")
    if not (sft_dir / "config.json").is_file():
        data = root / "sft.jsonl"
        write_sft_data(data)
        run_sft(base, data, sft_dir, **SFT)
    _stage("3/5 evaluate the warm start")
    before = evaluate(recipe)
    print(json.dumps(before.to_dict()))
    _stage("4/5 asynchronous RL (k=2, VCPO)")
    run_dir = root / "rl"
    train(
        recipe.model_copy(update={"logging": recipe.logging.model_copy(update={"run_dir": str(run_dir)})}),
        resume=run_dir if (run_dir / "checkpoints").is_dir() else None,
    )
    _stage("5/5 evaluate after RL")
    after = evaluate(recipe, checkpoint=run_dir)
    curves = plot_run(run_dir)
    text = report(before, after, run_dir, curves, time.time() - t0)
    (root / "report.json").write_text(
        json.dumps({"before": before.to_dict(), "after": after.to_dict()}, indent=2)
    )
    (root / "report.txt").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
