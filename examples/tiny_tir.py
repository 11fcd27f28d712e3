"""The CPU main job, end to end: tiny model from scratch -> SFT warm start -> async VCPO RL -> report.

Run: `python -m examples.tiny_tir [--fresh] [--set KEY=VALUE ...]` (what `make run` does, without --set); the recipe
is recipes/tiny_tir.yaml.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from agent_rl import errors
from agent_rl.config import load_recipe
from agent_rl.tools.tiny import build_tiny
from envs.tiny_arith import corpus, teacher_traces
from examples.pipeline import RECIPES, run

# Warm start: the teacher uses the tool on 30% of the hard problems and guesses on the rest. The
# drill traces (all tool use, first token context-only) teach the tool branch itself, copying the
# expression into print(...) and the output into \boxed{}, without moving the 30% decision.
SFT_TRACES, SFT_DRILL, SFT_TOOL_RATE, SFT_SEED, SFT_DRILL_SEED = 3000, 3000, 0.3, 7, 8
# device cpu: the recipe's figures are the CPU's; SFT on a GPU rounds differently and this small model's warm
# start carried that far (0.11 instead of 0.25 on an H200, 2026-11-26). recipes/tiny_tir.yaml pins the learner.
SFT = dict(epochs=2, lr=2e-3, batch_size=16, max_len=128, warmup_steps=10, device="cpu")
MODEL = dict(vocab_size=512, hidden=256, layers=2, heads=4, kv_heads=2)


def write_sft_data(base: Path, path: Path) -> None:
    """Decision traces (tool on SFT_TOOL_RATE of hard problems) plus tool-branch drills, shuffled by the SFT."""
    rows = [tr.sft_row() for tr in teacher_traces(SFT_TRACES, seed=SFT_SEED, tool_rate=SFT_TOOL_RATE)]
    drills = teacher_traces(SFT_DRILL, seed=SFT_DRILL_SEED, tool_rate=1.0, easy_fraction=0.0)
    rows += [tr.sft_row(train_first_token=False) for tr in drills]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fresh", action="store_true", help="delete runs/tiny_tir first")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe field, as agent-rl train --set (e.g. learner.device=cuda; the recorded figures are "
        "the recipe's as it is)",
    )  # fmt: skip
    args = p.parse_args(argv)
    # One torch thread: the model's matrices are too small to gain from a second core, and two threads
    # slow down several-fold whenever the sandbox or anything else on the machine wants a core.
    torch.set_num_threads(1)
    return run(
        load_recipe(RECIPES / "tiny_tir.yaml", args.set),
        title="tiny_tir",
        build_base=lambda base: build_tiny(base, corpus(), seed=0, **MODEL),
        write_sft_data=write_sft_data,
        sft=SFT,
        fresh=args.fresh,
    )


if __name__ == "__main__":
    raise SystemExit(errors.run(main))  # a bad --set or recipe: one line, exit 2
