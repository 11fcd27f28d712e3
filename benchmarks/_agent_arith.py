"""The agent_arith warm start for benchmarks/vs_trl.py, built by the agent_arith pipeline's own functions
(examples/agent_arith.py), so the benchmark trains from exactly what `python -m examples.agent_arith` trains."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def warm_start(work: Path, scale: float = 1.0) -> Path:
    """Tokenizer with the Hermes tool template, tiny Qwen2, SFT on teacher traces, into `work`; reused when
    present. scale < 1: that share of the SFT data and one epoch (--quick)."""
    sft_dir = work / "sft"
    if (sft_dir / "config.json").is_file():
        return sft_dir
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from agent_rl.tools.sft import run_sft
    from examples import agent_arith as p

    base = work / "base"
    if not (base / "config.json").is_file():
        p.build_base(base)
    data = work / "sft.jsonl"
    p.write_sft_data(base, data, scale=scale)
    run_sft(base, data, sft_dir, **(p.SFT | ({"epochs": 1} if scale < 1 else {})))
    return sft_dir
