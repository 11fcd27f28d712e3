"""The study's task: window sums of a digit string, scored per position.

A prompt is `prompt_len` random digits x_1..x_P. The answer is P-1 digits; position t should
hold (x_t + x_{t+1}) mod 10, and the reward is the fraction of positions right. A random
policy over the 12-token vocabulary scores about 1/12 (≈ 8 %), so the policy gradient is
non-zero from the first step, and a 66k-parameter GRU needs a few hundred steps to learn it:
long enough for stale samples to matter. The digit strings are split once, by a fixed
permutation, into a training pool and a held-out set the learner never samples from.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

DIGITS = 10
BOS, SEP = 10, 11
VOCAB = 12


@dataclass(frozen=True)
class WindowSumTask:
    prompt_len: int = 3
    heldout: int = 200
    split_seed: int = 1234

    def __post_init__(self) -> None:
        if self.prompt_len < 2:
            raise ValueError(f"WindowSumTask.prompt_len must be >= 2 (one window), got {self.prompt_len}")
        if not 0 < self.heldout < DIGITS**self.prompt_len:
            raise ValueError(
                f"WindowSumTask.heldout must be in (0, {DIGITS**self.prompt_len}), got {self.heldout}"
            )

    @property
    def answer_len(self) -> int:
        return self.prompt_len - 1

    @property
    def seq_len(self) -> int:
        """BOS, the digits, SEP, the answer."""
        return self.prompt_len + 2 + self.answer_len

    def _split(self) -> tuple[Tensor, Tensor]:
        every = torch.tensor(list(itertools.product(range(DIGITS), repeat=self.prompt_len)), dtype=torch.long)
        order = torch.randperm(len(every), generator=torch.Generator().manual_seed(self.split_seed))
        return every[order[self.heldout :]], every[order[: self.heldout]]

    def train_prompts(self) -> Tensor:
        """[N_train, P] digits the learner samples prompts from."""
        return self._split()[0]

    def heldout_prompts(self) -> Tensor:
        """[heldout, P] digits used only to evaluate the current policy."""
        return self._split()[1]

    def context(self, digits: Tensor) -> Tensor:
        """[B, P] digits -> [B, P + 2] token ids BOS x_1..x_P SEP (what the policy continues)."""
        b = digits.shape[0]
        bos = torch.full((b, 1), BOS, dtype=torch.long)
        sep = torch.full((b, 1), SEP, dtype=torch.long)
        return torch.cat([bos, digits, sep], dim=1)

    def targets(self, digits: Tensor) -> Tensor:
        """[B, P-1] the right answer digits."""
        return (digits[:, :-1] + digits[:, 1:]) % DIGITS

    def reward(self, digits: Tensor, answer: Tensor) -> Tensor:
        """[B] fraction of answer positions equal to the window sum (a non-digit token is wrong)."""
        if answer.shape != (digits.shape[0], self.answer_len):
            raise ValueError(
                f"WindowSumTask.reward: answer has shape {tuple(answer.shape)}, "
                f"expected {(digits.shape[0], self.answer_len)}"
            )
        return (answer == self.targets(digits)).float().mean(dim=1)
