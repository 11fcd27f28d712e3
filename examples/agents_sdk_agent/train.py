"""The Agents SDK agent, trained: agent_arith's warm start -> eval -> async RL -> eval, with the agent written
with the OpenAI Agents SDK (examples/agents_sdk_agent/agent.py) running every episode through the gateway.

The warm start is examples/agent_arith.py's (tiny Qwen2 with a Hermes tool-calling template, SFT on teacher
traces): the SDK agent offers the same `python` tool and sends the problem as the only message, so the model
sees the prompts it was warm-started on. Each stage is skipped when its output exists (an existing
runs/agent_arith/sft is reused). Run: `python -m examples.agents_sdk_agent.train [--fresh]`.
"""

from __future__ import annotations

import argparse

import torch

from agent_rl.config import load_recipe
from examples.agent_arith import SFT, build_base, write_sft_data
from examples.pipeline import RECIPES, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--fresh", action="store_true", help="delete runs/agents_sdk_arith first (the warm start stays)"
    )
    p.add_argument("--set", nargs="*", default=[], help="recipe overrides, key=value")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    recipe = load_recipe(RECIPES / "cookbooks" / "agents_sdk_arith.yaml", args.set)
    return run(
        recipe,
        title="agents_sdk_arith (OpenAI Agents SDK agent)",
        build_base=build_base,
        write_sft_data=write_sft_data,
        sft=SFT,
        fresh=args.fresh,
        turns_label="model calls / episode",
    )


if __name__ == "__main__":
    raise SystemExit(main())
