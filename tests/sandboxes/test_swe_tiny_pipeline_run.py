"""examples/swe_tiny.py end to end with a Docker engine (the private dockerd of conftest.py): generate, build,
SFT, evaluate, train, evaluate, report and curves, on the --quick settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.heavy  # builds a model, SFT, evaluates and trains with containers: minutes
def test_the_pipeline_runs_end_to_end_and_reports_the_solve_rate(docker_host: str, tmp_path: Path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "examples.swe_tiny", "--quick", "--docker-host", docker_host,
         "--set", f"logging.run_dir={run_dir}"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["before"]["tasks"] == report["after"]["tasks"] == 4
    assert "accuracy gain" in out.stdout and (run_dir / "rl" / "curves.png").is_file()
