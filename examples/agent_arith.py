"""The agent example, end to end: tiny model -> SFT warm start of the tool-call format -> eval -> async RL -> eval.

The agent is examples/arith_agent/agent.py, an ordinary OpenAI function-calling loop; every episode runs
it against the recording gateway (envs/tiny_arith_agent.yaml, `type: agent`). The tiny model gets a
chat template with Hermes tool calls (agent_rl/openai/templates.py) and learns the tool-call format by
SFT on teacher traces rendered in it, exactly as the gateway will render the conversation: the teacher
calls the tool on 30% of the hard problems (plus drills that teach the call without moving that
decision), as the main job's warm start does. Each stage is skipped when its output exists.
Run: `python -m examples.agent_arith [--fresh] [--quick]`; the recipe is recipes/agent_arith.yaml.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from agent_rl.config import load_recipe
from agent_rl.openai.templates import HERMES_TOOLS
from agent_rl.tools.tiny import build_model, train_tokenizer
from envs.tiny_arith import Trace, expression, teacher_traces
from examples.arith_agent.agent import TOOLS
from examples.pipeline import RECIPES, run

SFT_TRACES, SFT_DRILL, SFT_TOOL_RATE, SFT_SEED, SFT_DRILL_SEED = 3000, 3000, 0.3, 7, 8
SFT = dict(epochs=2, lr=2e-3, batch_size=16, max_len=192, warmup_steps=10)
MODEL = dict(hidden=256, layers=2, heads=4, kv_heads=2)
CALL_OPEN = "<tool_call>"


def call_text(trace: Trace) -> str:
    code = f"print({expression(trace.task)})"
    return CALL_OPEN + "\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def chat_row(tok, trace: Trace, train_first_token: bool = True) -> dict:
    """A teacher trace as the gateway renders it: the prompt through the chat template with the tools, the
    tool call and final answer as trained pieces, the tool result and its template glue as context."""
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": trace.task.problem}],
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
    )
    if not trace.used_tool:
        return {"prompt": prompt, "response": [{"text": trace.segments[0].text, "train": True}]}
    call = call_text(trace)
    first = (
        [{"text": call + tok.eos_token, "train": True}]
        if train_first_token
        else [
            {"text": CALL_OPEN, "train": False},
            {"text": call[len(CALL_OPEN) :] + tok.eos_token, "train": True},
        ]
    )
    result = trace.segments[1].text
    glue = (
        f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    return {
        "prompt": prompt,
        "response": [*first, {"text": glue, "train": False}, {"text": trace.segments[2].text, "train": True}],
    }


def rows_text(row: dict) -> str:
    return row["prompt"] + "".join(p["text"] for p in row["response"])


def build_base(out: Path) -> None:
    """Tokenizer trained on the traces as rendered in the Hermes template, and a fresh Qwen2 over it."""
    from transformers import PreTrainedTokenizerFast

    probe = train_tokenizer(["x"], 300)  # any tokenizer with the special tokens, to render the corpus
    probe.chat_template = HERMES_TOOLS
    corpus = [rows_text(chat_row(probe, t)) for t in teacher_traces(2000, 12345, tool_rate=0.5)]
    tok: PreTrainedTokenizerFast = train_tokenizer(corpus, 512)
    tok.chat_template = HERMES_TOOLS
    model = build_model(
        len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, seed=0, **MODEL
    )
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def write_sft_data(base: Path, path: Path, scale: float = 1.0) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    n, drill = int(SFT_TRACES * scale), int(SFT_DRILL * scale)
    rows = [chat_row(tok, t) for t in teacher_traces(n, seed=SFT_SEED, tool_rate=SFT_TOOL_RATE)]
    drills = teacher_traces(drill, seed=SFT_DRILL_SEED, tool_rate=1.0, easy_fraction=0.0)
    rows += [chat_row(tok, t, train_first_token=False) for t in drills]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fresh", action="store_true", help="delete runs/agent_arith first")
    p.add_argument(
        "--quick",
        action="store_true",
        help="check the pipeline in a few minutes (runs/agent_arith_quick: 10%% of the SFT data, 2 RL steps, "
        "16 eval tasks); its accuracies mean nothing",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as examples/tiny_tir.py: the matrices are too small to gain from a second core
    quick = [
        "name=agent_arith_quick",
        "model.path=runs/agent_arith_quick/sft",
        "train.steps=2",
        "eval.limit=16",
        "eval.every=0",
    ]
    recipe = load_recipe(RECIPES / "agent_arith.yaml", quick if args.quick else [])
    scale = 0.1 if args.quick else 1.0
    return run(
        recipe,
        title="agent_arith",
        build_base=build_base,
        write_sft_data=lambda base, path: write_sft_data(base, path, scale),
        sft=SFT | ({"epochs": 1} if args.quick else {}),
        fresh=args.fresh,
        turns_label="chat calls / episode",
    )


if __name__ == "__main__":
    raise SystemExit(main())
