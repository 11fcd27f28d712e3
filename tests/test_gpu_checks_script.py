"""scripts/gpu_checks.sh, the one command a GPU session runs: what can be checked without a GPU.

The wheels it installs are cp312 (the GPU machine's Python) and its benchmarks need CUDA, so the pytest part's
run goes through a stand-in `pip` at the install step (a script on PATH that succeeds): the test checks the
script's own work (which parts run, in which order, where the logs land), not the install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_checks.sh"


def _run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_misspelt_part_is_refused_before_anything_is_installed(tmp_path: Path) -> None:
    r = _run(tmp_path, {"PARTS": "pytest holdd"})
    assert r.returncode == 2
    assert "PARTS: unknown part 'holdd' (pytest, profile, reads, hold, learners, mainjob)" in r.stdout
    assert not (tmp_path / "out" / "logs.tar.gz").exists(), "nothing ran, nothing was packed"


def test_pytest_part_with_a_stand_in_pip_packs_its_log_into_the_tarball(tmp_path: Path) -> None:
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "pip").write_text("#!/bin/sh\nexit 0\n")
    (shim / "pip").chmod(0o755)
    # this venv's python (pytest-xdist is there)
    (shim / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python").chmod(0o755)
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    r = _run(
        tmp_path,
        {
            "PATH": f"{shim}:{os.environ['PATH']}",
            "PARTS": "pytest",
            "PYTEST_PATHS": str(tests),
            "WORKERS": "0",  # in the one process: the test checks the script, not xdist
            "COMMIT": "abc1234",
        },
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pytest rc=0" in r.stdout and "1 passed" in r.stdout
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        log = tar.extractfile("./pytest_cuda.txt").read().decode()  # type: ignore[union-attr]
    assert {"install.txt", "device.txt", "pytest_cuda.txt"} <= names
    assert "test_one.py::test_one" in log and "1 passed" in log, log
    back = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert back == ["logs.tar.gz"], "one file back, not one per log"
