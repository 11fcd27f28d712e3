"""Which run directory a training run writes to, so that two runs never mix in one directory.

A fresh run refuses a directory that already holds a run (its metrics.jsonl would get steps 0..N
twice and its checkpoints would be overwritten). `--resume RUN_DIR` continues one, `--resume auto`
continues the recipe's own run dir if it has a checkpoint and starts fresh if it is empty. A resumed
run reads the config it was started with and warns about every field the current one changes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from agent_rl.config import Recipe
from agent_rl.errors import UserError

AUTO = "auto"
RUN_FILES = ("metrics.jsonl", "batches.jsonl", "checkpoints")
SAVED_CONFIG = "resolved_config.json"


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` already holds (part of) a training run."""
    return any((run_dir / name).exists() for name in RUN_FILES)


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest").exists()


def choose(recipe: Recipe, resume: str | Path | None) -> tuple[Path, bool]:
    """(run dir, whether to resume from its latest checkpoint) for `agent-rl train [--resume ...]`."""
    if resume is None or str(resume) == AUTO:
        run_dir = recipe.run_dir
        if resume is not None and has_checkpoint(run_dir):
            return run_dir, True
        if holds_run(run_dir):
            what = "its latest checkpoint" if has_checkpoint(run_dir) else "no checkpoint yet"
            raise UserError(
                f"run dir {run_dir} already holds a run ({what}); continue it with --resume {run_dir} "
                f"(or --resume auto), or start a new one with --set name=NEW_NAME or --set logging.run_dir=DIR"
                + ("" if has_checkpoint(run_dir) else f" (or delete {run_dir})")
            )
        return run_dir, False
    run_dir = Path(resume)
    if not run_dir.is_dir():
        raise UserError(f"--resume {run_dir}: no such directory (give a run dir written by `agent-rl train`)")
    if not has_checkpoint(run_dir):
        raise UserError(
            f"--resume {run_dir}: no checkpoints/latest in it (the run stopped before its first checkpoint: "
            "delete it and start again, or set checkpoint.every to save sooner)"
        )
    return run_dir, True


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    """The resolved config a run was started with, or None if it has none."""
    path = run_dir / SAVED_CONFIG
    return json.loads(path.read_text()) if path.is_file() else None


def load_saved(run_dir: Path) -> Recipe:
    """The recipe a run was started with (`agent-rl train --resume RUN_DIR` without a recipe)."""
    data = saved_config(run_dir)
    if data is None:
        raise UserError(
            f"--resume {run_dir}: no {SAVED_CONFIG} in it; pass the recipe too: agent-rl train RECIPE --resume {run_dir}"
        )
    return Recipe.model_validate(data)


def differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """`dotted.key: old -> new` for every leaf that differs between two resolved configs."""
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out


def warn_on_differences(run_dir: Path, recipe: Recipe) -> list[str]:
    """Print (stderr) and return the fields in which `recipe` differs from the config the run started with."""
    saved = saved_config(run_dir)
    if saved is None:
        return []
    diff = differences(saved, recipe.model_dump(mode="json"))
    if diff:
        print(
            f"warning: resuming {run_dir} with a config that differs from the one it was started with "
            f"(using the new one): {'; '.join(diff)}",
            file=sys.stderr,
        )
    return diff


def announce(run_dir: Path, recipe: Recipe, resuming: bool) -> None:
    """The run dir and how to watch it, printed once at the start of training."""
    verb = "resuming" if resuming else "writing"
    print(f"{verb} run dir: {run_dir}", file=sys.stderr)
    sinks = recipe.logging.sinks
    if "tensorboard" in sinks:
        print(f"  curves: tensorboard --logdir {run_dir / 'tb'}", file=sys.stderr)
    if "wandb" in sinks:
        print(
            f"  wandb: {run_dir / 'wandb'} (offline unless WANDB_MODE is set: `wandb sync` uploads)",
            file=sys.stderr,
        )
    if "mlflow" in sinks:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        print(f"  mlflow: mlflow ui --backend-store-uri {uri}", file=sys.stderr)


def write_resolved(recipe: Recipe, run_dir: Path, *, dry_run: bool = False) -> Path:
    """The recipe with every default filled in, as JSON (`resolved_config.json`; a dry run writes
    `resolved_config.dry_run.json`, leaving a run's own record alone). Returns the file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / (SAVED_CONFIG.replace(".json", ".dry_run.json") if dry_run else SAVED_CONFIG)
    path.write_text(json.dumps(recipe.model_dump(mode="json"), indent=2))
    return path
