"""benchmarks/moe_replay.py --quick end to end (make test-heavy): every stage runs, every cell is written, and a
second run finds them all done (resumable) and writes the same figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.heavy  # a benchmark end to end (~1.8 min): make test-heavy (make test's 30-minute budget)
def test_quick_run_writes_every_cell_and_resumes(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "moe_replay.py"), "--quick", "--work", str(tmp_path)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads((tmp_path / "moe_replay.json").read_text())
    assert len(result["mismatch"]) == 2 * 2 * 3 and len(result["rl"]) == 2
    for cell in result["mismatch"]:
        assert 0.0 <= cell["routing_agreement"] <= 1.0 and cell["mismatch_max"] >= 0.0
        if cell["dtype"] == "float32" and cell["replay"] == "rollout":
            assert cell["mismatch_max"] <= 1e-4
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "moe_replay.json").read_text())["mismatch"] == result["mismatch"]
    assert "| bfloat16 | rollout |" in (tmp_path / "moe_replay.md").read_text()
