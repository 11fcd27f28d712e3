"""The learners' AdamW, built and restored one way for the torch and the Megatron learner.

Fused: torch's AdamW that updates every parameter in one kernel per step, on CUDA and on CPU. torch's default
(foreach) launches a chain of kernels and keeps a parameter-sized temporary on CUDA: on one H200 the torch
learner's optimizer took 2.6x the time of transformers' fused AdamW on the same model
(benchmarks/results/gpu_profile_2026-11-27.md; with fused, 1.3x: gpu_profile.md), and on CPU fused is about 5x
faster. Both give the same update up to float rounding. No weight decay on 1-D parameters (norm scales, biases),
as Megatron and HF Trainer do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def adamw(
    params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    params = list(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
        fused=True,
    )


def load_adamw_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore a checkpoint's AdamW state. A checkpoint's groups carry the implementation they were saved with
    (foreach before 2026-11-27), which load_state_dict would bring back: the fused one stays."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group.update(fused=True, foreach=None)
