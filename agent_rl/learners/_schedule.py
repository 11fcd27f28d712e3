"""Learning-rate schedules shared by the learners and SFT: linear warmup, then constant, cosine or linear decay."""

from __future__ import annotations

import math
from typing import Literal

import torch

Schedule = Literal["constant", "cosine", "linear"]


def lr_factor(step: int, *, schedule: Schedule, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based); decays reach 0 at `total_steps`."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    raise ValueError(f"unknown lr schedule {schedule!r}; expected constant, cosine or linear")


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, schedule: Schedule, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR (so its state_dict round-trips through checkpoints) over `lr_factor`."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps),
    )
