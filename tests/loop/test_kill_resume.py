"""SIGKILL a real training run (its whole process tree) mid-training, resume it, and compare with
an uninterrupted run: every prompt used exactly as often, no trajectory lost or duplicated, and every
trajectory trained the same by content (token ids, versions, reward; from the trajectory log, which records all
of them here), its tokens sampled with the weights of the checkpoint it resumed from (behaviour log-probs
against a forward pass of that checkpoint: the two runs' weights after several Adam steps differ by more
than rounding, see tests/loop/parity.py, so their log-probs are not compared with each other); with the
episodes in the driver (rollout.workers 1) and sharded over two rollout processes."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from float_bounds import TINY_LOGPROB_ATOL
from loop_paths import DENSE_ENV, HERE, ROOT
from proc_tree import tree
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from agent_rl.viewer.log import read_step
from vcpo.logprobs import logprobs_of

STEPS = 6


def _cmd(tiny_model_dir: Path, run_dir: Path, resume: bool, workers: int) -> list[str]:
    args = [
        str(ROOT / "recipes" / "tiny_tir_smoke.yaml"),
        "--set", f"model.path={tiny_model_dir}",
        "--set", f"logging.run_dir={run_dir}",
        "--set", f"envs.train={DENSE_ENV}",
        "--set", "buffer.max_staleness=0",  # synchronous: the uninterrupted run's batches are fully determined
        "--set", f"train.steps={STEPS}",
        "--set", "checkpoint.every=2",
        "--set", "logging.trajectories=all",  # every trained trajectory's tokens, to compare by content
        "--set", f"rollout.workers={workers}",
    ] + (["--resume", str(run_dir)] if resume else [])  # fmt: skip
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); from agent_rl.trainer import main_train; main_train({args!r})"
    return [sys.executable, "-c", code]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _content(t) -> tuple:
    return (
        t.uid,
        t.task_id,
        t.prompt_ids,
        [(s.token_ids, s.sampled, s.versions) for s in t.segments],
        t.reward,
    )


def _batches(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]


@pytest.mark.slow
# two rollout workers in make test-heavy (make test's 30-minute budget); one in make test
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.heavy)])
def test_sigkilled_run_resumes_with_every_prompt_used_exactly_as_often(
    tiny_model_dir: Path, tmp_path: Path, workers: int
) -> None:
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    _run(_cmd(tiny_model_dir, whole, resume=False, workers=workers))

    proc = subprocess.Popen(
        _cmd(tiny_model_dir, killed, resume=False, workers=workers),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        ckpt = killed / "checkpoints" / "latest"
        done = (
            (killed / "batches.jsonl").read_text().count("\n") if (killed / "batches.jsonl").exists() else 0
        )
        if ckpt.exists() and os.readlink(ckpt) >= "step_000002" and done >= 3:  # latest -> step_N
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed mid-training"
    for pid in tree(proc.pid):  # the whole process tree: trainer, sandboxes, anything else it started
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    resumed_from = os.readlink(killed / "checkpoints" / "latest")
    state = pickle.loads((killed / "checkpoints" / resumed_from / "loop.pkl").read_bytes())
    assert state.buffer["open"], "the checkpoint holds no in-flight groups: nothing to restore"
    version = int(resumed_from.removeprefix("step_"))  # the weights after `version` steps
    restored = load_file(str(killed / "checkpoints" / resumed_from / "hf" / "model.safetensors"))

    _run(_cmd(tiny_model_dir, killed, resume=True, workers=workers))

    a, b = _batches(whole), _batches(killed)
    assert [r["step"] for r in b] == list(range(STEPS))
    assert [r["tasks"] for r in a] == [r["tasks"] for r in b], "prompts used differently after kill + resume"
    uids = [u for r in b for u in r["uids"]]
    assert len(uids) == len(set(uids)), "a trajectory was delivered twice"
    assert uids == [u for r in a for u in r["uids"]], "a trajectory was lost or replaced"
    for step in range(STEPS):  # by content, not only by uid: the resumed run trained the same tokens
        whole_step, killed_step = read_step(whole, step), read_step(killed, step)
        assert [_content(t) for t in killed_step.trajectories] == [
            _content(t) for t in whole_step.trajectories
        ], f"step {step}: a trajectory's tokens, versions or reward differ after kill + resume"
    checked = _assert_sampled_with(tiny_model_dir, restored, version, killed)
    assert checked > 0, f"no token of the resumed run was sampled by version {version}"
    metrics = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert metrics == list(range(STEPS)), (
        "metrics of the killed run's lost steps were not truncated on resume"
    )


def _assert_sampled_with(
    model_dir: Path, weights: dict[str, torch.Tensor], version: int, run_dir: Path
) -> int:
    """Every token the run sampled at `version` has the behaviour log-prob a float32 forward of `weights` gives
    (at temperature 1, the smoke recipe's), up to rounding (float_bounds.TINY_LOGPROB_ATOL); returns how many."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(weights)
    checked = 0
    for step in range(STEPS):
        for t in read_step(run_dir, step).trajectories:
            ids = list(t.prompt_ids) + [i for s in t.segments for i in s.token_ids]
            with torch.no_grad():
                lp = logprobs_of(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
            pos = len(t.prompt_ids)
            for s in t.segments:
                for j, (v, mu) in enumerate(zip(s.versions, s.behavior_logprobs, strict=True)):
                    if v == version:
                        assert abs(float(lp[pos + j]) - mu) <= TINY_LOGPROB_ATOL, (
                            f"step {step}: {t.uid}: token {pos + j} sampled by version {version} has log μ {mu}, "
                            f"the checkpoint gives {float(lp[pos + j])}"
                        )
                        checked += 1
                pos += len(s.token_ids)
    return checked
