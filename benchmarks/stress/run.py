"""One run of the study: a method, a lag k, a learning rate and a seed -> curves and step statistics.

The update is `vcpo.Step` with the method's `StepConfig`; nothing here computes a loss, a
weight or a baseline. What this file adds is the loop around it: sample from the version k
steps back, step, publish the new version, and every `eval_every` steps score the CURRENT
policy greedily on the held-out prompts (a stale run's training reward describes the policy
of k steps ago, so it is logged but never used as the result).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

import vcpo
from benchmarks.stress.policy import GRUPolicy, generate
from benchmarks.stress.sampler import LagSampler
from benchmarks.stress.task import CountTask

_COMPARE = {"advantage": "grpo", "ess_lr_rule": "none"}
METHODS: dict[str, dict[str, str]] = {
    "plain": {"loss": "reinforce", **_COMPARE},  # off-policy REINFORCE, no correction
    "tis": {"loss": "tis_seq", **_COMPARE},  # sequence-level truncated IS
    "mis": {"loss": "mis", **_COMPARE},  # sequence-level masking of w > c
    "m2po": {"loss": "m2po", **_COMPARE},  # second-moment token masking
    "vcpo": {"loss": "vcpo", "advantage": "opob", "ess_lr_rule": "sqrt"},
    "ess_lr": {"loss": "vcpo", "advantage": "grpo", "ess_lr_rule": "sqrt"},  # VCPO without OPOB
    "opob": {"loss": "vcpo", "advantage": "opob", "ess_lr_rule": "none"},  # VCPO without the ESS lr
}


@dataclass(frozen=True)
class RunConfig:
    method: str
    lag: int
    lr: float
    seed: int
    steps: int = 300
    batch_prompts: int = 16
    group_size: int = 8
    eval_every: int = 10
    opob_mode: str = "exact"  # exact: a backward per trajectory (as in the paper) | proxy
    base: int = 10
    answer_len: int = 4
    heldout: int = 20
    eval_samples: int = 0  # 0: greedy held-out reward; n: mean reward of n sampled answers per prompt

    def step_config(self) -> vcpo.StepConfig:
        if self.method not in METHODS:
            raise ValueError(f"RunConfig.method = {self.method!r}; expected one of {sorted(METHODS)}")
        batch = self.batch_prompts * self.group_size
        return vcpo.StepConfig(**METHODS[self.method], opob_mode=self.opob_mode, micro_batch_size=batch)


@dataclass
class RunResult:
    config: RunConfig
    eval_steps: list[int] = field(default_factory=list)
    heldout_reward: list[float] = field(default_factory=list)  # greedy, current policy
    train_reward: list[float] = field(default_factory=list)  # per step, the behaviour policy's samples
    ess_ratio: list[float] = field(default_factory=list)
    is_weight_max: list[float] = field(default_factory=list)  # truncated at c
    log_ratio_abs_max: list[float] = field(default_factory=list)  # untruncated max |s_i|
    kl: list[float] = field(default_factory=list)  # k3 KL(behaviour || current) per token
    grad_norm: list[float] = field(default_factory=list)
    lr_scale: list[float] = field(default_factory=list)
    learner_seconds: list[float] = field(default_factory=list)  # vcpo.Step only
    sample_seconds: list[float] = field(default_factory=list)
    max_staleness: int = 0
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def heldout_reward(policy: GRUPolicy, task: CountTask, samples: int = 0) -> float:
    """Greedy reward on the held-out prompts, or (samples > 0) the mean over sampled answers:
    the policy's expected reward, which moves smoothly even when the greedy answer does not."""
    digits = task.heldout_prompts()
    if samples:
        digits = digits.repeat_interleave(samples, dim=0)
    gen = torch.Generator().manual_seed(0) if samples else None
    answer = generate(policy, task.context(digits), task.answer_len, generator=gen, greedy=not samples)
    return float(task.reward(digits, answer).mean())


def run(cfg: RunConfig) -> RunResult:
    """Train one policy; a numerical failure ends the run early and is recorded, not raised."""
    torch.manual_seed(cfg.seed)
    task = CountTask(base=cfg.base, answer_len=cfg.answer_len, heldout=cfg.heldout)
    policy = GRUPolicy(task.vocab)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    step = vcpo.Step(policy, optimizer, cfg.step_config())
    sampler = LagSampler(
        policy,
        task,
        lag=cfg.lag,
        batch_prompts=cfg.batch_prompts,
        group_size=cfg.group_size,
        generator=torch.Generator().manual_seed(cfg.seed + 10_000),
    )
    res = RunResult(cfg)
    sampler.publish(0, policy)
    for version in range(cfg.steps):
        if version % cfg.eval_every == 0:
            res.eval_steps.append(version)
            res.heldout_reward.append(heldout_reward(policy, task, cfg.eval_samples))
        t0 = time.perf_counter()
        sampled = sampler.sample()
        t1 = time.perf_counter()
        try:
            m = step(sampled.batch)
        except (FloatingPointError, ValueError) as e:  # NaN gradient, all weights zero, ...
            res.error = f"step {version}: {e}"
            break
        t2 = time.perf_counter()
        res.max_staleness = max(res.max_staleness, version - sampled.behavior_version)
        res.train_reward.append(float(sampled.batch.rewards.mean()))
        res.ess_ratio.append(m.ess_ratio)
        res.is_weight_max.append(m.is_weight_max)
        res.log_ratio_abs_max.append(m.log_ratio_abs_max)
        res.kl.append(m.kl_behavior_current)
        res.grad_norm.append(m.grad_norm)
        res.lr_scale.append(m.lr_scale)
        res.sample_seconds.append(t1 - t0)
        res.learner_seconds.append(t2 - t1)
        sampler.publish(version + 1, policy)
    if res.error is None:
        res.eval_steps.append(cfg.steps)
        res.heldout_reward.append(heldout_reward(policy, task, cfg.eval_samples))
    elif not all(math.isfinite(p.detach().sum().item()) for p in policy.parameters()):
        res.heldout_reward.append(0.0)  # a destroyed policy scores nothing from here on
        res.eval_steps.append(len(res.train_reward))
    else:
        res.eval_steps.append(len(res.train_reward))
        res.heldout_reward.append(heldout_reward(policy, task, cfg.eval_samples))
    return res
