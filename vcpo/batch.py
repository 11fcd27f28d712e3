"""The tensors one optimizer step consumes: flattened trajectories of one data-parallel rank."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class BatchError(ValueError):
    """A PolicyBatch violates its contract; the message names the field, row and value."""


@dataclass
class PolicyBatch:
    """B right-padded trajectories; all members of a prompt group are in the same batch.

    Convention: the log-prob at position t is log p(input_ids[t] | input_ids[:t]); position
    0 is never in the loss.
    """

    input_ids: Tensor  # [B, T] long, right-padded
    attention_mask: Tensor  # [B, T] 1 on real tokens
    loss_mask: Tensor  # [B, T] float, 1 on model-sampled tokens that count in the loss
    behavior_logprobs: Tensor  # [B, T] log μ of token t (0 where loss_mask == 0)
    rewards: Tensor  # [B] float
    group_index: Tensor  # [B] long prompt-group id
    teacher_logprobs: Tensor | None = None  # [B, T] log π_T of token t (distillation; 0 where loss_mask == 0)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> PolicyBatch:
        return PolicyBatch(
            *(t.to(device) for t in self._fields()), teacher_logprobs=_to(self.teacher_logprobs, device)
        )

    def select(self, rows: Tensor, *, width: int | None = None) -> PolicyBatch:
        """The given rows, with trailing all-padding columns cut off (less compute per chunk). `width`: the
        longest selected row's length when the caller knows it (on a GPU, reading it here waits for the device)."""
        am = self.attention_mask[rows]
        if width is None:
            width = max(int((am > 0).sum(-1).max()), 1) if rows.numel() else 1
        return PolicyBatch(
            self.input_ids[rows, :width],
            am[:, :width],
            self.loss_mask[rows, :width],
            self.behavior_logprobs[rows, :width],
            self.rewards[rows],
            self.group_index[rows],
            None if self.teacher_logprobs is None else self.teacher_logprobs[rows, :width],
        )

    def _fields(self) -> tuple[Tensor, ...]:
        return (
            self.input_ids,
            self.attention_mask,
            self.loss_mask,
            self.behavior_logprobs,
            self.rewards,
            self.group_index,
        )

    def validate(self) -> None:
        """Raise BatchError on any broken invariant; cheap enough to run every step."""
        if self.input_ids.dim() != 2:
            raise BatchError(f"input_ids must be [B, T], got shape {tuple(self.input_ids.shape)}")
        b, t = self.input_ids.shape
        if b == 0:
            raise BatchError("empty PolicyBatch (B = 0)")
        optional = ("teacher_logprobs",) if self.teacher_logprobs is not None else ()
        for name in ("attention_mask", "loss_mask", "behavior_logprobs", *optional):
            shape = tuple(getattr(self, name).shape)
            if shape != (b, t):
                raise BatchError(f"{name} has shape {shape}, expected {(b, t)} like input_ids")
        for name in ("rewards", "group_index"):
            shape = tuple(getattr(self, name).shape)
            if shape != (b,):
                raise BatchError(f"{name} has shape {shape}, expected ({b},)")
        if self.input_ids.dtype != torch.long or self.group_index.dtype != torch.long:
            raise BatchError(
                f"input_ids and group_index must be torch.long, got {self.input_ids.dtype}, {self.group_index.dtype}"
            )
        am, lm = self.attention_mask > 0, self.loss_mask
        if bool((am[:, 1:] & ~am[:, :-1]).any()):
            row = int((am[:, 1:] & ~am[:, :-1]).any(-1).nonzero()[0, 0])
            raise BatchError(f"attention_mask row {row} is not right-padded (a real token follows padding)")
        _row_error(((lm != 0) & (lm != 1)), "loss_mask", "must be 0 or 1", lm)
        _row_error((lm > 0) & ~am, "loss_mask", "is 1 on a padding token", lm)
        _row_error(lm[:, :1] > 0, "loss_mask", "is 1 at position 0, which has no log-prob", lm)
        blp = self.behavior_logprobs
        _row_error(
            (lm > 0) & ~(torch.isfinite(blp) & (blp <= 1e-4)),
            "behavior_logprobs",
            "must be finite and <= 0 on loss tokens",
            blp,
        )
        _row_error(~torch.isfinite(self.rewards)[:, None], "rewards", "must be finite", self.rewards[:, None])
        if (tlp := self.teacher_logprobs) is not None:
            _row_error(
                (lm > 0) & ~(torch.isfinite(tlp) & (tlp <= 1e-4)),
                "teacher_logprobs",
                "must be finite and <= 0 on loss tokens",
                tlp,
            )


def _to(t: Tensor | None, device: torch.device | str) -> Tensor | None:
    return None if t is None else t.to(device)


def _row_error(bad: Tensor, field: str, what: str, values: Tensor) -> None:
    if bool(bad.any()):
        row, col = (int(x) for x in bad.nonzero()[0])
        raise BatchError(f"{field} {what}: row {row}, position {col} holds {float(values[row, col])}")
