"""The study's task: count from a start digit in steps of a second digit, scored per position.

A prompt is two digits (a, s). The answer is `answer_len` digits; position t should hold
(y_{t-1} + s) mod base, with y_0 = a, judged against the policy's OWN previous digit so one
slip costs one position, not the rest of the answer. The reward is the fraction of positions
right. A random policy over the vocabulary (base digits, BOS, SEP) scores 1/(base + 2)
(≈ 8 % for base 10), so the policy gradient is non-zero from the first step, and a
66k-parameter GRU needs ~150-300 steps to learn it: long enough for stale samples to matter.
The rule is the same (previous digit, step) table for every prompt, so the held-out prompts,
which the learner never samples, measure the rule and not memorised answers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CountTask:
    base: int = 10  # digits are 0..base-1; token `base` is BOS, `base + 1` is SEP
    answer_len: int = 4
    heldout: int = 20
    split_seed: int = 1234

    def __post_init__(self) -> None:
        if self.base < 2:
            raise ValueError(f"CountTask.base must be >= 2, got {self.base}")
        if self.answer_len < 1:
            raise ValueError(f"CountTask.answer_len must be >= 1, got {self.answer_len}")
        if not 0 < self.heldout < self.base**2:
            raise ValueError(f"CountTask.heldout must be in (0, {self.base**2}), got {self.heldout}")

    @property
    def vocab(self) -> int:
        return self.base + 2

    def _split(self) -> tuple[Tensor, Tensor]:
        every = torch.tensor(list(itertools.product(range(self.base), repeat=2)), dtype=torch.long)
        order = torch.randperm(len(every), generator=torch.Generator().manual_seed(self.split_seed))
        return every[order[self.heldout :]], every[order[: self.heldout]]

    def train_prompts(self) -> Tensor:
        """[N_train, 2] (start, step) pairs the learner samples prompts from."""
        return self._split()[0]

    def heldout_prompts(self) -> Tensor:
        """[heldout, 2] pairs used only to evaluate the current policy."""
        return self._split()[1]

    def context(self, digits: Tensor) -> Tensor:
        """[B, 2] digits -> [B, 4] token ids BOS a s SEP (what the policy continues)."""
        b = digits.shape[0]
        bos = torch.full((b, 1), self.base, dtype=torch.long)
        sep = torch.full((b, 1), self.base + 1, dtype=torch.long)
        return torch.cat([bos, digits, sep], dim=1)

    def reward(self, digits: Tensor, answer: Tensor) -> Tensor:
        """[B] fraction of positions t with answer_t == (answer_{t-1} + s) mod base (answer_0 := a)."""
        if answer.shape != (digits.shape[0], self.answer_len):
            raise ValueError(
                f"CountTask.reward: answer has shape {tuple(answer.shape)}, "
                f"expected {(digits.shape[0], self.answer_len)}"
            )
        prev = torch.cat([digits[:, :1], answer[:, :-1]], dim=1)
        # A non-digit previous token (BOS/SEP sampled as an answer) makes the next target
        # out of range: that position can only be wrong, never accidentally right.
        target = torch.where(prev < self.base, (prev + digits[:, 1:2]) % self.base, -1)
        return (answer == target).float().mean(dim=1)
