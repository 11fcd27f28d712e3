"""Ctrl-C and SIGTERM to a real `python -m examples.swe_tiny` in its RL stage, with episodes in containers: the run
stops, no container it started is left, and the same command resumes it.

The run is started as a shell without job control starts a background job (`make run-swe &` in a script, an agent's
shell): with SIGINT ignored. Ctrl-C (`kill -INT`) must stop it at once all the same (exit 130): the old pipeline
inherited the ignore and trained on. The same command then resumes RL from its last checkpoint, and SIGTERM (a
scheduler's stop) ends it after the step in progress, which is checkpointed (exit 143, a line saying how to go on).
Each signal is sent at a known event (a training step logged while the run's containers are up), never after a
sleep; the waits are bounded only so that a run that does not stop fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandboxes.docker_engine import docker_client, our_containers, owner_id

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40  # far more than the run gets to before a signal: it must stop early
HUNG_S = 300  # bounds a hung run (the old code's never-ending shutdown); no timing claim


def _cmd(host: str, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "examples.swe_tiny", "--quick", "--docker-host", host,
        "--set", f"logging.run_dir={run_dir}", "--set", f"train.steps={STEPS}", "--set", "eval.limit=1",
    ]  # fmt: skip


def _start(host: str, run_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            _cmd(host, run_dir),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,  # the signals reach the run alone, never pytest
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # a background job's inheritance
        )


def _steps_logged(run_dir: Path) -> list[int]:
    metrics = run_dir / "rl" / "metrics.jsonl"
    if not metrics.is_file():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")]


def _containers(client, owner: str) -> list:
    return our_containers(client, **{"agent-rl.owner": owner})


def _wait_for_step(proc: subprocess.Popen[bytes], run_dir: Path, after: int, log: Path) -> None:
    """Until the run has logged a step beyond `after` (RL runs: episodes are in flight in containers)."""
    deadline = time.monotonic() + 1800  # the quick pipeline up to RL: minutes on a loaded machine
    while len(_steps_logged(run_dir)) <= after and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended before the signal:\n{log.read_text()[-3000:]}"
    assert len(_steps_logged(run_dir)) > after, f"no step logged in time:\n{log.read_text()[-3000:]}"


def _stop(proc: subprocess.Popen[bytes], sig: int, log: Path) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=HUNG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(
            f"the run did not stop within {HUNG_S} s of {signal.Signals(sig).name}:\n{log.read_text()[-3000:]}"
        )


def _gone(client, owner: str) -> list:
    """The run's containers still there once it exited (a container removing itself: waited for, bounded)."""
    deadline = time.monotonic() + 60
    while (left := _containers(client, owner)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.heavy  # builds a model, SFT, evaluates and trains with containers, twice: minutes
def test_ctrl_c_then_sigterm_stop_the_pipeline_with_no_container_left_and_it_resumes(
    docker_host: str, tmp_path: Path
):
    client = docker_client(docker_host)
    run_dir, log = tmp_path / "run", tmp_path / "out.txt"

    proc = _start(docker_host, run_dir, log)
    try:
        _wait_for_step(proc, run_dir, 1, log)  # two steps logged: the first one's checkpoint is surely saved
        owner = owner_id(proc.pid)
        assert _containers(client, owner), "the run's episodes should be in containers when the signal comes"
        code = _stop(proc, signal.SIGINT, log)
    finally:
        proc.kill()
    out = log.read_text()
    assert code == 130, out[-3000:]
    assert _gone(client, owner) == []
    assert "swe_tiny: stopped; RL step" in out and "is checkpointed: the same command again resumes" in out, (
        out[-3000:]
    )
    assert "Traceback" not in out, out[-3000:]
    checkpointed = int(os.readlink(run_dir / "rl" / "checkpoints" / "latest").rpartition("_")[2])

    proc = _start(docker_host, run_dir, log)  # the same command: resumes RL from the checkpoint
    try:
        # a step past the checkpoint's next: the stopped run may have logged one step after its last checkpoint
        _wait_for_step(proc, run_dir, checkpointed + 1, log)
        owner = owner_id(proc.pid)
        assert _containers(client, owner)
        code = _stop(proc, signal.SIGTERM, log)
    finally:
        proc.kill()
    out = log.read_text()
    logged = _steps_logged(run_dir)
    assert code == 143, out[-3000:]
    assert _gone(client, owner) == []
    assert "Traceback" not in out, out[-3000:]
    assert logged == list(range(len(logged))) and checkpointed < len(logged) < STEPS, logged
    assert (run_dir / "rl" / "checkpoints" / f"step_{len(logged):06d}").is_dir(), (
        "the stopped step's checkpoint"
    )
    assert f"agent-rl: stopped by SIGTERM; RL step {len(logged)} is checkpointed" in out, out[-2000:]
