"""benchmarks/proxy_hold.py end to end on the tiny model: both variants run in their own processes, and the
held one runs layer 0's attention forward twice per trajectory (forward, recomputed forward), the other three
times (the forward without gradients for the baseline first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.learners import memory as mm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _learner_bench import SMALL  # noqa: E402


@pytest.mark.slow
@pytest.mark.heavy  # four learner processes (~20 s): CI's second job, off make test's budget
def test_the_held_group_runs_one_forward_fewer_per_trajectory(tmp_path: Path) -> None:
    out = tmp_path / "proxy_hold"
    proc = subprocess.run(
        [sys.executable, "benchmarks/proxy_hold.py", "--length", "64", "--rounds", "2", "--repeats", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.with_suffix(".json").read_text())
    trajectories = 2
    assert result["variants"]["forward-only"]["attention0_forwards"] == 3 * trajectories
    assert result["variants"]["held"]["attention0_forwards"] == 2 * trajectories
    assert len(result["ratio_rounds"]) == 2 and result["ratio"] > 0 and result["ratio_of"] == "cpu_s"
    held, plain = (result["variants"][v]["estimate_bytes"] for v in ("held", "forward-only"))
    assert held > plain  # the memory model counts the second trajectory's checkpoints
    # peak tensor memory is counted from before the rank is built: at least the fp32 weights and AdamW's moments
    params = mm.ModelDims.from_config(SMALL | {"model_type": "qwen2"}).params
    for v in ("held", "forward-only"):
        assert result["variants"][v]["peak_bytes"] >= 3 * 4 * params, v
    assert "| held |" in out.with_suffix(".md").read_text()


def test_a_model_dir_without_config_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/proxy_hold.py", "--model", str(tmp_path), "--out", str(tmp_path / "x")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"--model {tmp_path}: no config.json there" in proc.stderr and "Traceback" not in proc.stderr
