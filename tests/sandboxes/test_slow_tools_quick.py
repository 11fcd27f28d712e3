"""benchmarks/slow_tools.py --quick end to end with a Docker engine (the private dockerd of conftest.py): suite,
images, warm starts, a sync, an async and a TRL run in containers (TRL's tuning pass first), their checkpoints
evaluated, the results file."""

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
# a warm start, image builds, three training runs in containers (TRL's tuning pass first), their evaluations: 2.5 min
# on the idle 2-core machine (2026-12-07): make test-heavy, which makes .venv-trl
@pytest.mark.heavy
def test_the_quick_run_writes_its_results_file(docker_host: str, tmp_path: Path):
    # the TRL cell runs where TRL's venv is (bash scripts/setup_trl.sh), and is left out, saying so, where not
    trl = (ROOT / ".venv-trl" / "bin" / "python").is_file()
    out = subprocess.run(
        [sys.executable, "benchmarks/slow_tools.py", "--quick", "--docker-host", docker_host,
         "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *([] if trl else ["--no-trl"])],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "slow_tools_quick.json").read_text())
    cells = {r["cell"] for r in data["cells"]}
    assert cells == {"sync k=0", "async k=2", *(["trl"] if trl else [])}
    if trl:  # TRL's run: its steps timed, its checkpoints scored, its episodes' verdicts recorded
        (r,) = [r for r in data["cells"] if r["cell"] == "trl"]
        assert (
            len(r["curve"]) == 1 + data["design"]["sync_steps"]
        )  # the warm start and each step's checkpoint
        assert data["design"]["trl_tuning"]["chosen"] and "goal_vs_trl_reached" in data["summary"]
        assert data["meta"]["venvs"]["trl"]["trl"]  # TRL's side's versions, from its own venv
    for r in data["cells"]:
        assert r["tools"]["episodes"] > 0 and 0 < r["tools"]["tool_share_median"] <= 1
        # the machine's cores busy over the run: one share per core, the run itself kept some busy
        assert len(r["core_busy"]) == os.cpu_count() and 0 < sum(r["core_busy"]) <= os.cpu_count()
        assert r["in_flight"]["episodes"] > 0 and r["in_flight"]["mean"] > 0
    assert (tmp_path / "out" / "slow_tools_quick.md").is_file() and (
        tmp_path / "out" / "slow_tools_quick.png"
    ).is_file()
