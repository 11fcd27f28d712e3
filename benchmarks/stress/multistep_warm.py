"""The warm start of the k-sweep's task (envs/tiny_multistep.py): tiny Qwen2 from scratch -> SFT -> held-out eval.

    .venv/bin/python -m benchmarks.stress.multistep_warm [--fresh]    # -> runs/tiny_multistep/{base,sft,warm_eval.json}

The main job's pipeline (examples/pipeline.py) without its RL stage: the k-sweep's runs are the RL. Each stage is
skipped when its output exists. SFT data: decision traces (the teacher goes on with the tool at each turn boundary
with probability CONTINUE_RATE, else boxes a guess) plus drills (every call made, every turn's opening fence
context-only), so SFT teaches how to chain the calls and leaves each go-on decision at about CONTINUE_RATE. The
drill rows are written here rather than by `examples.pipeline.sft_row`, which makes only the first fence context.

The k-sweep does not rebuild this: it runs from the copy the repository keeps (benchmarks/results/stress/
k_sweep_warm, built here with this module; its SOURCE.md). The build is deterministic on one CPU, but another CPU
rounds the 750 SFT steps differently and the warm start ends elsewhere (held-out 0.08 on one machine, 0.12 on
another, same code and seed).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from envs.tiny_multistep import Trace, corpus, teacher_traces

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny_multistep.yaml"
FENCE = "```"
CONTINUE_RATE = 0.5
SFT_TRACES, SFT_DRILLS, SFT_SEED, SFT_DRILL_SEED = 3000, 3000, 7, 8
SFT = dict(epochs=2, lr=2e-3, batch_size=16, max_len=256, warmup_steps=10)
# the main job's 2.1M-parameter Qwen2 (at hidden 128 it copied three-digit operands with slips after SFT: held-out
# 0.00 on the first version of the task)
MODEL = dict(vocab_size=512, hidden=256, layers=2, heads=4, kv_heads=2)


def sft_row(trace: Trace, drill: bool) -> dict:
    """A trace as an `agent-rl sft` row: model pieces trained, tool output context only; in a drill every model
    piece's opening fence is context too (the row teaches what follows each go-on decision, not the decision)."""
    pieces: list[dict] = []
    for s in trace.segments:
        if s.kind == "observation":
            pieces.append({"text": "```output\n" + s.text + "\n```\n", "train": False})
        elif drill and s.text.startswith(FENCE):
            pieces += [{"text": FENCE, "train": False}, {"text": s.text[len(FENCE) :], "train": True}]
        else:
            pieces.append({"text": s.text, "train": True})
    return {"prompt": trace.prompt, "response": pieces}


def write_sft_data(path: Path, traces: int = SFT_TRACES, drills: int = SFT_DRILLS) -> None:
    rows = [sft_row(t, drill=False) for t in teacher_traces(traces, SFT_SEED, CONTINUE_RATE)]
    rows += [sft_row(t, drill=True) for t in teacher_traces(drills, SFT_DRILL_SEED, continue_rate=1.0)]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def build(root: Path, fresh: bool = False) -> dict:
    """base -> sft -> warm_eval.json under root (the recipe's model.path must be root/sft); returns the eval."""
    import torch

    from agent_rl.config import load_recipe
    from agent_rl.evaluate import evaluate
    from agent_rl.tools.sft import run_sft
    from agent_rl.tools.tiny import build_tiny

    torch.set_num_threads(1)  # the main job's choice: these matrices gain nothing from a second core
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    base, sft = root / "base", root / "sft"
    if not (base / "config.json").is_file():
        print("1/3 tokenizer + Qwen2 from scratch", flush=True)
        build_tiny(base, corpus(), seed=0, **MODEL)
    if not (sft / "config.json").is_file():
        print(
            f"2/3 SFT: {SFT_TRACES} decision traces (go on with p={CONTINUE_RATE}) + {SFT_DRILLS} drills",
            flush=True,
        )
        write_sft_data(root / "sft.jsonl")
        run_sft(base, root / "sft.jsonl", sft, **SFT)
    out = root / "warm_eval.json"
    if not out.is_file():
        print("3/3 held-out eval of the warm start", flush=True)
        recipe = load_recipe(RECIPE, [f"model.path={sft}"])
        out.write_text(json.dumps(evaluate(recipe).to_dict(), indent=1))
    report = json.loads(out.read_text())
    print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("runs/tiny_multistep"))
    ap.add_argument("--fresh", action="store_true", help="delete ROOT first")
    args = ap.parse_args(argv)
    build(args.root, args.fresh)


if __name__ == "__main__":
    main()
