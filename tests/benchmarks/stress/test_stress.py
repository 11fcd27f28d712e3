"""The staleness study's own machinery: lag injection, the task, and that sync training learns."""

from __future__ import annotations

import copy

import pytest
import torch

import vcpo
from benchmarks.stress.policy import GRUPolicy, generate
from benchmarks.stress.run import METHODS, RunConfig, run
from benchmarks.stress.sampler import LagSampler
from benchmarks.stress.task import CountTask


def _perturb(policy: GRUPolicy, seed: int) -> None:
    """A stand-in for an optimizer step: every version has visibly different weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_lag_injection_samples_batch_v_with_version_v_minus_k(lag: int) -> None:
    torch.manual_seed(0)
    task = CountTask()
    policy = GRUPolicy(task.vocab)
    sampler = LagSampler(
        policy, task, lag=lag, batch_prompts=4, group_size=2, generator=torch.Generator().manual_seed(1)
    )
    versions = {}
    sampler.publish(0, policy)
    versions[0] = copy.deepcopy(policy)
    for v in range(8):
        sb = sampler.sample()
        assert sb.behavior_version == max(0, v - lag)
        b = sb.batch
        # The behaviour log-probs are those of exactly that version's weights, and of no other. The sampler computed
        # them with this same call on these same tensors (in this process): equal bit for bit, so the bound only
        # has to sit below what one perturbation (_perturb) moves them by.
        for u, model in versions.items():
            lp = vcpo.logprobs_of(model, b.input_ids, b.attention_mask) * b.loss_mask
            same = torch.allclose(lp, b.behavior_logprobs, atol=1e-6)
            assert same == (u == sb.behavior_version), (v, u)
        _perturb(policy, seed=v)
        sampler.publish(v + 1, policy)
        versions[v + 1] = copy.deepcopy(policy)


def test_run_records_exactly_k_versions_of_staleness() -> None:
    res = run(RunConfig(method="plain", lag=3, lr=1e-3, seed=0, steps=6, batch_prompts=2, group_size=2))
    assert res.error is None
    assert res.max_staleness == 3


def test_publish_out_of_order_is_refused() -> None:
    policy = GRUPolicy(CountTask().vocab)
    sampler = LagSampler(
        policy, CountTask(), lag=1, batch_prompts=1, group_size=2, generator=torch.Generator()
    )
    sampler.publish(0, policy)
    with pytest.raises(ValueError, match="got version 2, expected 1"):
        sampler.publish(2, policy)


def test_importance_weights_are_one_at_k0() -> None:
    torch.manual_seed(0)
    policy = GRUPolicy(CountTask().vocab)
    sampler = LagSampler(
        policy,
        CountTask(),
        lag=0,
        batch_prompts=8,
        group_size=4,
        generator=torch.Generator().manual_seed(0),
    )
    sampler.publish(0, policy)
    b = sampler.sample().batch
    lp = vcpo.logprobs_of(policy, b.input_ids, b.attention_mask)
    s = vcpo.sequence_log_weights(lp, b.behavior_logprobs, b.loss_mask)
    # k=0: the sampler's log-probs are this same logprobs_of call on the same tensors, bit for bit: s is 0 and the
    # weights 1 exactly; the bounds below are loose on purpose (any difference at all would be a bug here)
    assert s.abs().max() < 1e-5
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    m = vcpo.Step(policy, opt, RunConfig(method="tis", lag=0, lr=1e-3, seed=0).step_config())(b)
    assert m.ess_ratio == pytest.approx(1.0, abs=1e-6)
    assert m.is_weight_max == pytest.approx(1.0, abs=1e-5)
    assert m.kl_behavior_current == pytest.approx(0.0, abs=1e-8)


def test_random_policy_reward_is_near_one_in_twelve() -> None:
    # Uniform tokens: position 1 is right w.p. 1/12; later ones need a digit before them too,
    # so the expectation is (1/12)(1 + 3 * 10/12) / 4 ≈ 0.073.
    task = CountTask()
    digits = task.train_prompts().repeat(20, 1)
    uniform = torch.randint(12, (len(digits), task.answer_len), generator=torch.Generator().manual_seed(0))
    assert float(task.reward(digits, uniform).mean()) == pytest.approx(0.073, abs=0.01)
    rewards = []
    for seed in range(3):  # an untrained policy samples close to uniformly
        torch.manual_seed(seed)
        ans = generate(
            GRUPolicy(task.vocab), task.context(digits), task.answer_len, generator=None, greedy=False
        )
        rewards.append(float(task.reward(digits, ans).mean()))
    assert 0.04 < sum(rewards) / 3 < 0.12


def test_reward_follows_the_policys_own_previous_digit() -> None:
    task = CountTask()
    digits = torch.tensor([[3, 4], [3, 4], [3, 4]])
    answer = torch.tensor(
        [[7, 1, 5, 9], [7, 2, 6, 0], [10, 4, 8, 2]]
    )  # right; one slip; BOS, then right again
    assert task.reward(digits, answer).tolist() == [1.0, 0.75, 0.5]


def test_heldout_prompts_are_never_in_the_training_pool() -> None:
    task = CountTask()
    train = {tuple(r) for r in task.train_prompts().tolist()}
    held = {tuple(r) for r in task.heldout_prompts().tolist()}
    assert len(held) == task.heldout and not train & held
    assert len(train) + len(held) == task.base**2


def test_every_method_is_a_valid_vcpo_step_config() -> None:
    for m in METHODS:
        RunConfig(method=m, lag=0, lr=1e-3, seed=0).step_config().check()
    with pytest.raises(ValueError, match="expected one of"):
        RunConfig(method="nope", lag=0, lr=1e-3, seed=0).step_config()


def test_twenty_sync_steps_raise_the_expected_heldout_reward() -> None:
    # Sampled evaluation (64 answers per held-out prompt) is the policy's expected reward: it
    # moves within 20 steps, long before the greedy answer changes. Random level ≈ 0.07.
    cfg = RunConfig(
        method="plain",
        lag=0,
        lr=1e-2,
        seed=0,
        steps=20,
        batch_prompts=8,
        group_size=8,
        eval_every=20,
        eval_samples=64,
    )
    res = run(cfg)
    assert res.error is None
    before, after = res.heldout_reward[0], res.heldout_reward[-1]
    assert 0.04 < before < 0.11
    assert after > before + 0.01, res.heldout_reward
