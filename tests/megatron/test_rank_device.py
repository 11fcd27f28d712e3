"""A Megatron rank computes where the learner's pool put it: megatron-core places parameters on the current CUDA
device unless told otherwise, so "cpu" on a machine with GPUs must reach the model (seen on an H200: the memory
model's CPU test got a CUDA model)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from agent_rl.learners.megatron.rank import computes_on_cpu

pytestmark = pytest.mark.megatron


@pytest.mark.parametrize(("device", "cpu"), [("cpu", True), ("cuda", False), ("cuda:1", False)])
def test_a_named_device_decides(device: str, cpu: bool) -> None:
    assert computes_on_cpu(device) is cpu


@pytest.mark.parametrize("device", [None, "auto"])
def test_no_device_means_the_gpu_when_there_is_one(device: str | None) -> None:
    assert computes_on_cpu(device) is (not torch.cuda.is_available())


def test_the_one_rank_group_builds_its_model_on_the_named_device(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from _learner_bench import SMALL, Cell, Rank, write_model

    rank = Rank(write_model(tmp_path / "m", SMALL), Cell("megatron", 16, 2), "cpu")
    assert {p.device.type for p in rank.impl.model.parameters()} == {"cpu"}


# What a CPU rank of one must not touch on a machine with GPUs, run on this CPU-only torch: the child process is
# told a GPU is there (is_available, device_count, current_device: a fake at torch's CUDA query boundary), so any
# CUDA allocation or RNG call raises "Torch not compiled with CUDA enabled". Seen on an H200 (2026-11-27): megatron
# moved the rotary table to cuda:0 under a CPU model ("found at least two devices, cuda:0 and cpu").
_ONE_CPU_RANK_ON_A_GPU_MACHINE = """
import sys, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
sys.path.insert(0, "benchmarks")
from _learner_bench import SMALL, Cell, Rank, batch, write_model
model_dir = write_model(__import__("pathlib").Path(sys.argv[1]), SMALL)
rank = Rank(model_dir, Cell("megatron", 32, 2, recompute=True), "cpu")
b = batch(2, 32, SMALL["vocab_size"])
metrics = rank.step(b)
lp = rank.logprobs(b.input_ids, b.attention_mask)
assert torch.isfinite(lp).all() and lp.device.type == "cpu", lp
assert torch.cuda.current_device() == 0  # the caller's CUDA view is left as it was
print("ok", metrics["loss"])
"""


def test_a_cpu_rank_of_one_on_a_machine_with_gpus_never_touches_cuda(tmp_path: Path) -> None:
    import subprocess

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", _ONE_CPU_RANK_ON_A_GPU_MACHINE, str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
