"""`benchmarks/async_vs_sync.py --quick` runs end to end and writes the result shape the README relies on.

Slow (a small SFT warm start and four 4-6-step training runs): `make test-heavy` and `make test-slow` run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy
def test_quick_benchmark_writes_cells_and_a_summary(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "benchmarks/async_vs_sync.py",
        "--quick",
        "--work",
        str(tmp_path / "w"),
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "async_vs_sync_quick.json").read_text())
    cells = out["cells"]
    assert {(c["k"], c["method"]) for c in cells} == {(0, "vcpo"), (2, "vcpo"), (2, "plain")}
    for c in cells:
        assert {"k", "method", "seed", "final_accuracy", "time_to_sync_final_s"} <= c.keys()
        assert 0.0 <= c["final_accuracy"] <= 1.0
        assert c["time_to_sync_final_s"] is None or c["time_to_sync_final_s"] >= 0
        # the warm start, then every 2 steps: sync runs 4 steps, the others 1.5x as many (6)
        assert c["curve"][0][0] == 0.0 and len(c["curve"]) == (3 if c["k"] == 0 else 4)
    s = out["summary"]
    assert {"sync_final_accuracy", "best_k", "speedup_to_sync_final"} <= s.keys()
    assert (tmp_path / "async_vs_sync_quick.png").stat().st_size > 0
