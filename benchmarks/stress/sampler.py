"""In-process sampler with deterministic lag injection (the `fixed_lag` mode, without the HTTP engine).

The learner publishes every version it makes; the sampler keeps the last k+1 of them and
samples batch v (taken when the learner holds version v) with version max(0, v - k), so each
batch is exactly k versions stale once v >= k, whatever the machine's speed. Behaviour
log-probs are recomputed by a full forward of that snapshot through vcpo's `logprobs_of`,
the same code the learner uses for the current policy, so at k = 0 every IS weight is 1.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

import vcpo
from benchmarks.stress.policy import GRUPolicy, generate
from benchmarks.stress.task import CountTask


@dataclass(frozen=True)
class SampledBatch:
    batch: vcpo.PolicyBatch
    behavior_version: int
    digits: Tensor  # [B, P] prompts, one row per trajectory


class LagSampler:
    def __init__(
        self,
        policy: GRUPolicy,
        task: CountTask,
        *,
        lag: int,
        batch_prompts: int,
        group_size: int,
        generator: torch.Generator,
    ) -> None:
        if lag < 0:
            raise ValueError(f"LagSampler: lag must be >= 0, got {lag}")
        self.task, self.lag, self.generator = task, lag, generator
        self.batch_prompts, self.group_size = batch_prompts, group_size
        self.pool = task.train_prompts()
        self.ring: deque[tuple[int, dict[str, Tensor]]] = deque(maxlen=lag + 1)
        self.behavior = copy.deepcopy(policy).requires_grad_(False)
        self.loaded = -1

    def publish(self, version: int, policy: GRUPolicy) -> None:
        """Record the learner's weights as `version` (call once per version, in order, from 0)."""
        expected = self.ring[-1][0] + 1 if self.ring else 0
        if version != expected:
            raise ValueError(f"LagSampler.publish: got version {version}, expected {expected}")
        self.ring.append((version, {k: v.detach().clone() for k, v in policy.state_dict().items()}))

    def sample(self) -> SampledBatch:
        """One batch of `batch_prompts` groups of `group_size`, from the oldest version kept."""
        if not self.ring:
            raise RuntimeError("LagSampler.sample: no version published yet")
        version, weights = self.ring[0]
        if version != self.loaded:
            self.behavior.load_state_dict(weights)
            self.loaded = version
        pick = torch.randint(len(self.pool), (self.batch_prompts,), generator=self.generator)
        digits = self.pool[pick].repeat_interleave(self.group_size, dim=0)
        context = self.task.context(digits)
        answer = generate(
            self.behavior, context, self.task.answer_len, generator=self.generator, greedy=False
        )
        ids = torch.cat([context, answer], dim=1)
        mask = torch.ones_like(ids)
        loss_mask = torch.zeros(ids.shape, dtype=torch.float32)
        loss_mask[:, context.shape[1] :] = 1.0
        with torch.no_grad():
            behavior_lp = vcpo.logprobs_of(self.behavior, ids, mask) * loss_mask
        batch = vcpo.PolicyBatch(
            input_ids=ids,
            attention_mask=mask,
            loss_mask=loss_mask,
            behavior_logprobs=behavior_lp,
            rewards=self.task.reward(digits, answer),
            group_index=torch.arange(self.batch_prompts).repeat_interleave(self.group_size),
        )
        return SampledBatch(batch, version, digits)
