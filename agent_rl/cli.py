"""`agent-rl` command line. Each subcommand imports its module only when it runs, so --help is instant."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _validate(args: argparse.Namespace) -> int:
    """Check each file as what its top-level keys say it is: a recipe or an env."""
    from agent_rl import errors
    from envs.yamlio import ConfigError

    failed = False
    for path in args.files:
        try:
            kind = _check_file(path, check_model=not args.skip_model)
        except ConfigError as e:
            for line in e.errors:
                print(line, file=sys.stderr)
            failed = True
        else:
            print(f"{path}: ok ({kind})")
    return errors.EXIT_USER if failed else 0


def _check_file(path: Path, *, check_model: bool) -> str:
    import envs
    from envs.yamlio import ConfigError, read_yaml

    data, _ = read_yaml(path)
    kind = file_kind(data)
    if kind is None:
        keys = sorted(data) if isinstance(data, dict) else []
        raise ConfigError(
            [
                f"{path}:1: <root>: neither a recipe nor an env (top-level keys {keys}); a recipe has model:, "
                "envs:, train:; an env has data:, prompt:, reward: (a staleness-study file is checked by "
                "`python -m benchmarks.stress.grid --check FILE`)"
            ]
        )
    if kind == "recipe":
        from agent_rl.config import load_recipe

        recipe = load_recipe(path, check_model=check_model)
        for env_path in (recipe.envs.train, *recipe.envs.eval):
            envs.load(env_path)
    else:
        envs.load(path)
    return kind


def file_kind(data: object) -> str | None:
    """recipe or env: the schema whose own top-level fields the file uses most (ties: recipe); None when no
    schema claims at least half of the file's keys.

    A recipe missing `train:` is still a recipe (it has `model:`, `envs:`...), so its error is the missing section."""
    from agent_rl.config import Recipe
    from envs.spec import EnvSpec

    keys = set(data) if isinstance(data, dict) else set()
    own = {"recipe": set(Recipe.model_fields) - set(EnvSpec.model_fields)}
    own["env"] = set(EnvSpec.model_fields) - set(Recipe.model_fields)
    score = {kind: len(keys & fields) for kind, fields in own.items()}
    best = max(score, key=lambda k: (score[k], k == "recipe"))
    return best if score[best] and 2 * score[best] >= len(keys) else None


def _plot(args: argparse.Namespace) -> int:
    from agent_rl.viewer.plot import plot_run

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
    "sft": ("agent_rl.tools.sft", "main", "supervised fine-tuning on a jsonl data set"),
    "serve": (
        "agent_rl.engines.embedded.server",
        "main",
        "serve a model with the embedded engine (SGLang + OpenAI APIs)",
    ),
    "gateway": (
        "agent_rl.gateway.standalone",
        "main",
        "recording OpenAI gateway in front of running engines, for agents in any process",
    ),
    "sandbox": ("sandboxes.cli", "main", "sandbox service (serve) and Docker image (build-image)"),
    "harbor": ("envs.harbor.cli", "main", "Harbor task suites: validate, oracle, generate, base-image"),
    "prepare": (
        "agent_rl.tools.pretrained",
        "main",
        "write an offline pretrained model as a HF directory (smollm2)",
    ),
    "tiny-model": ("agent_rl.tools.tiny", "main", "build a small tokenizer + Qwen2 model from scratch"),
    "consistency": (
        "agent_rl.consistency",
        "main",
        "where a recipe's trainer-engine log-prob mismatch comes from (dtype, head, routing, packing, kernels)",
    ),
    "view": (
        "agent_rl.viewer",
        "main",
        "write a run's recorded trajectories as a self-contained HTML viewer",
    ),
    "engines": (
        "agent_rl.engines.elastic",
        "main",
        "engines add|remove|list RUN_DIR: change a running job's engine replicas",
    ),
    "data": (
        "agent_rl.tools.data_pull",
        "main",
        "data pull [NAME...]: download the GPU recipes' data sets (checked)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agent-rl",
        description="Asynchronous RL for LLMs on multi-turn tool use. "
        "--debug (anywhere): show the full traceback of any error.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check recipe or environment YAML files (file:line:field errors)")
    v.add_argument("files", nargs="+", type=Path)
    v.add_argument(
        "--skip-model",
        action="store_true",
        help="do not require model.path to be a HF model directory (recipes whose path is a placeholder)",
    )
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
    """Run one subcommand. The project's own errors print one line and exit 2 (`errors.EXIT_USER`);
    `--debug` (anywhere on the line) or AGENT_RL_DEBUG=1 keeps the traceback."""
    import os

    from agent_rl import errors

    _configure_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("AGENT_RL_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if argv and argv[0] in DELEGATED:
        import importlib

        module, func, _ = DELEGATED[argv[0]]
        return errors.run(lambda: getattr(importlib.import_module(module), func)(argv[1:]), debug=debug)
    args = build_parser().parse_args(argv)
    return errors.run(lambda: args.func(args), debug=debug)


def _configure_logging() -> None:
    """Warnings of every library on stderr, plus the data loaders' fix reports (once per split)."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("envs.datasets").setLevel(logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
