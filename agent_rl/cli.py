"""`agent-rl` command line. Each subcommand imports its module only when it runs, so --help is instant."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _validate(args: argparse.Namespace) -> int:
    from envs.yamlio import ConfigError, read_yaml

    failed = False
    for path in args.files:
        try:
            data, _ = read_yaml(path)
            if isinstance(data, dict) and "train" in data and "model" in data:
                from agent_rl.config import load_recipe

                recipe = load_recipe(path)
                import envs

                for env_path in (recipe.envs.train, *recipe.envs.eval):
                    envs.load(env_path)
                kind = "recipe"
            else:
                import envs

                envs.load(path)
                kind = "env"
        except ConfigError as e:
            print(e, file=sys.stderr)
            failed = True
        else:
            print(f"{path}: ok ({kind})")
    return 1 if failed else 0


def _plot(args: argparse.Namespace) -> int:
    from agent_rl.plot import plot_run

    for run_dir in args.run_dirs:
        print(plot_run(run_dir))
    return 0


# Subcommands whose module owns its own argparse: name -> (module, function, help).
DELEGATED: dict[str, tuple[str, str, str]] = {
    "train": (
        "agent_rl.trainer",
        "main_train",
        "train a recipe: async RL with VCPO (--resume, --set, --dry-run)",
    ),
    "eval": ("agent_rl.evaluate", "main_eval", "evaluate a checkpoint on a recipe's eval split"),
    "sft": ("agent_rl.sft", "main", "supervised fine-tuning on a jsonl data set"),
    "serve": (
        "agent_rl.engines.server",
        "main",
        "serve a model with the embedded engine (SGLang + OpenAI APIs)",
    ),
    "sandbox": ("sandboxes.cli", "main", "sandbox service (serve) and Docker image (build-image)"),
    "prepare": (
        "agent_rl.pretrained",
        "main",
        "write an offline pretrained model as a HF directory (smollm2)",
    ),
    "tiny-model": ("agent_rl.tiny", "main", "build a small tokenizer + Qwen2 model from scratch"),
    "view": ("agent_rl.viewer", "main", "write a run's recorded trajectories as a self-contained HTML viewer"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agent-rl", description="Asynchronous RL for LLMs on multi-turn tool use."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check recipe or environment YAML files (file:line:field errors)")
    v.add_argument("files", nargs="+", type=Path)
    v.set_defaults(func=_validate)

    pl = sub.add_parser(
        "plot", help="draw a run's standard curves (reward, ESS, grad norm, staleness, throughput) to PNG"
    )
    pl.add_argument("run_dirs", nargs="+", type=Path)
    pl.set_defaults(func=_plot)
    for name, (_, _, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        import importlib

        module, func, _ = DELEGATED[argv[0]]
        return getattr(importlib.import_module(module), func)(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
