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
