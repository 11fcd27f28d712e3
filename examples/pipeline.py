"""What the example pipelines share: build a base model -> SFT warm start -> eval -> async RL -> eval -> report.

Each stage is one agent-rl call (the same functions `agent-rl tiny-model | sft | eval | train` run) and
is skipped when its output already exists, so an interrupted pipeline picks up where it stopped.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from agent_rl.config import Recipe
from agent_rl.evaluate import EvalReport, evaluate
from agent_rl.tools.sft import run_sft
from agent_rl.trainer import train
from agent_rl.viewer.plot import plot_run

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def stage(name: str) -> None:
    print(f"\n=== {name} [{time.strftime('%H:%M:%S')}]", flush=True)


def run(
    recipe: Recipe,
    *,
    title: str,
    build_base: Callable[[Path], None],
    write_sft_data: Callable[[Path, Path], None],
    sft: dict,
    fresh: bool,
    turns_label: str = "turns / episode",
    base_label: str = "build tokenizer + Qwen2 model from scratch",
    sft_label: str = "SFT warm start on teacher traces (tool used on 30% of hard problems)",
) -> int:
    """The whole pipeline for `recipe` (its model.path is where the warm start goes); prints and writes
    RUN_DIR/report.{txt,json}."""
    t0 = time.time()
    root = recipe.run_dir
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
    elif (note := finished_note(root)) is not None:
        print(note, flush=True)
    root.mkdir(parents=True, exist_ok=True)
    base, sft_dir = root / "base", Path(recipe.model.path)
    stage(f"1/5 {base_label}")
    if not (base / "config.json").is_file():
        build_base(base)
    stage(f"2/5 {sft_label}")
    if not (sft_dir / "config.json").is_file():
        data = root / "sft.jsonl"
        write_sft_data(base, data)
        run_sft(base, data, sft_dir, **sft)
    stage("3/5 evaluate the warm start")
    before = evaluate(recipe)
    print(json.dumps(before.to_dict()))
    stage("4/5 asynchronous RL (k=2, VCPO)")
    run_dir = root / "rl"
    t_rl = time.time()
    train(
        recipe.model_copy(update={"logging": recipe.logging.model_copy(update={"run_dir": str(run_dir)})}),
        resume=run_dir if (run_dir / "checkpoints").is_dir() else None,
    )
    rl_seconds = time.time() - t_rl
    stage("5/5 evaluate after RL")
    after = evaluate(recipe, checkpoint=run_dir)
    curves = plot_run(run_dir)
    text = report(title, before, after, run_dir, curves, time.time() - t0, rl_seconds, turns_label)
    (root / "report.json").write_text(
        json.dumps({"before": before.to_dict(), "after": after.to_dict()}, indent=2)
    )
    (root / "report.txt").write_text(text + "\n")
    print("\n" + text)
    return 0


def finished_note(root: Path) -> str | None:
    """What a rerun over a finished pipeline does (every stage kept, the result reported again), or None."""
    if not (root / "report.json").is_file():
        return None
    return (
        f"{root}: a finished run is there; its stages are kept and its result is reported again "
        "(--fresh deletes it and starts a new run)"
    )


def report(
    title: str,
    before: EvalReport,
    after: EvalReport,
    run_dir: Path,
    curves: Path,
    seconds: float,
    rl_seconds: float,
    turns_label: str,
) -> str:
    rows = [
        ("accuracy", before.accuracy, after.accuracy),
        ("tool-use rate", before.tool_use_rate, after.tool_use_rate),
        (turns_label, before.turns_per_episode, after.turns_per_episode),
        ("tokens / s (eval)", before.tokens_per_s, after.tokens_per_s),
    ]
    lines = [f"{title}: held-out {after.env}/{after.split}, {after.tasks} tasks", ""]
    lines.append(f"{'':22s} {'warm start':>12s} {'after RL':>12s}")
    lines += [f"{name:22s} {b:12.3f} {a:12.3f}" for name, b, a in rows]
    gain = 100 * (after.accuracy - before.accuracy)
    lines += [
        "",
        f"accuracy gain: {gain:+.1f} points; RL {rl_seconds / 60:.1f} min; total {seconds / 60:.1f} min",
        f"curves: {curves}",
        f"run dir: {run_dir}",
        f"trajectories: agent-rl view {run_dir}  (writes {run_dir / 'view.html'}, open it in a browser)",
    ]
    return "\n".join(lines)
