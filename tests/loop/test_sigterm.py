"""SIGTERM to a real `agent-rl train` (a scheduler's time limit or preemption): the step in progress finishes and is
checkpointed, the run exits 143 with one line that says how to continue, nothing it started is left running, and
`--resume` continues from that step with every step logged once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loop_paths import DENSE_ENV, HERE, ROOT
from proc_tree import alive, tree

STEPS = 40  # far more than the run gets to before the signal: it must stop early


def _cmd(tiny_model_dir: Path, run_dir: Path, steps: int, ray: bool, resume: bool = False) -> list[str]:
    args = [
        "train", str(ROOT / "recipes" / "tiny_tir_smoke.yaml"),
        "--set", f"model.path={tiny_model_dir}",
        "--set", f"logging.run_dir={run_dir}",
        "--set", f"envs.train={DENSE_ENV}",
        "--set", f"train.steps={steps}",
        "--set", "checkpoint.every=0",  # no periodic checkpoint: only the stop's own can be there
    ]  # fmt: skip
    args += ["--set", "placement.sandbox={cpus: 1}"] if ray else []  # the sandbox as a Ray actor: a local Ray
    args += ["--resume", str(run_dir)] if resume else []
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); from agent_rl.cli import main; sys.exit(main({args!r}))"
    return [sys.executable, "-c", code]


def _steps_logged(run_dir: Path) -> list[int]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from Linux /proc")
@pytest.mark.parametrize("ray", [False, True], ids=["no-ray", "ray"])
def test_sigterm_checkpoints_the_step_in_progress_exits_143_and_resume_continues_from_it(
    tiny_model_dir: Path, tmp_path: Path, ray: bool
) -> None:
    """With Ray (ray.init installs a SIGTERM handler of its own in the driver) and without."""
    run_dir, err_file = tmp_path / "run", tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            _cmd(tiny_model_dir, run_dir, STEPS, ray), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 240  # bounds a hung test; no timing claim: we wait for two logged steps
        while len(_steps_logged(run_dir)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before the signal:\n{err_file.read_text()[-3000:]}"
        started = tree(proc.pid)  # trainer, engine, sandbox processes, rollout loop's helpers
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=240)
    finally:
        proc.kill()
    stderr = err_file.read_text()
    lines = [ln for ln in stderr.splitlines() if ln.startswith("agent-rl:")]
    logged = _steps_logged(run_dir)
    stopped = len(logged)
    assert code == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert lines[-1] == (
        f"agent-rl: stopped by SIGTERM after step {stopped} of {STEPS}, its checkpoint saved: "
        f"continue with agent-rl train --resume {run_dir}"
    )
    assert 2 <= stopped < STEPS and logged == list(range(stopped)), "a step was lost or logged twice"
    bars = re.findall(rf"(\d+)/{STEPS} \[", stderr)  # tqdm's frames; the last is drawn when the bar closes
    assert bars and int(bars[-1]) == stopped, f"the progress bar ends at {bars[-1:]}, not at step {stopped}"
    assert os.readlink(run_dir / "checkpoints" / "latest") == f"step_{stopped:06d}", "the stop's checkpoint"
    deadline = time.monotonic() + 60  # processes reparented at the run's exit (Ray's) may take a moment to go
    while (left := {pid for pid in started if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes the run started are still running: {sorted(left)}"

    resumed = subprocess.run(
        _cmd(tiny_model_dir, run_dir, stopped + 2, ray, resume=True), cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps_logged(run_dir) == list(range(stopped + 2)), "resume did not continue from the stop's step"
