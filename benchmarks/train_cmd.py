"""The `agent-rl train` command line the benchmarks run each cell with (one process per run, as a user runs it)."""

from __future__ import annotations

import sys
from pathlib import Path


def train_command(recipe: Path, sets: list[str]) -> list[str]:
    """`python -m agent_rl.cli train RECIPE --set k=v ...` with this interpreter."""
    return [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        str(recipe),
        *(a for s in sets for a in ("--set", s)),
    ]
