"""The agent_arith pipeline module (model build, SFT data) wherever main keeps it: examples/agent_arith.py
(the layout of issue #22) or recipes/agent_arith.py (before it)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def pipeline() -> ModuleType:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    for name in ("examples.agent_arith", "recipes.agent_arith"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name not in (name, name.split(".")[0]):
                raise
    raise SystemExit("neither examples/agent_arith.py nor recipes/agent_arith.py is in this checkout")


def warm_start(work: Path, scale: float = 1.0) -> Path:
    """The agent_arith warm start (tokenizer with the Hermes tool template, tiny Qwen2, SFT on teacher traces),
    built exactly as `python -m examples.agent_arith` builds it, into `work`; reused when present."""
    sft_dir = work / "sft"
    if (sft_dir / "config.json").is_file():
        return sft_dir
    from agent_rl.sft import run_sft

    p = pipeline()
    base = work / "base"
    if not (base / "config.json").is_file():
        p.build_base(base)
    data = work / "sft.jsonl"
    p.write_sft_data(base, data, scale=scale)
    run_sft(base, data, sft_dir, **(p.SFT | ({"epochs": 1} if scale < 1 else {})))
    return sft_dir
