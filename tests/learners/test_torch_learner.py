"""The torch learner on the tiny model: direction of the update, on-policy weights, resume, data parallel."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from float_bounds import sum_atol
from learner_helpers import CPU, first_gradient, make_groups, recipe_for

from agent_rl.learners import build
from agent_rl.learners.facade import RankLearner
from agent_rl.types import Group


def _seq_logprob(learner: RankLearner, group: Group) -> list[float]:
    """Sum of the learner's current log-probs over each trajectory's loss tokens."""
    from vcpo.logprobs import logprobs_of

    out = []
    with torch.no_grad():
        for t in group.trajectories:
            f = t.flatten()
            model = learner.local.model  # on the learner's own device: the test compares it with itself
            ids = torch.tensor([f.input_ids], device=next(model.parameters()).device)
            lp = logprobs_of(model, ids, torch.ones_like(ids))[0].cpu()
            out.append(float((lp * torch.tensor(f.loss_mask)).sum()))
    return out


@pytest.mark.parametrize("loss", ["vcpo", "tis_token", "ppo_clip"])
def test_step_raises_logprob_of_rewarded_and_lowers_unrewarded(tiny_model_dir: Path, loss: str) -> None:
    advantage = "opob" if loss == "vcpo" else "grpo"
    learner = build(recipe_for(tiny_model_dir, algorithm={"loss": loss, "advantage": advantage}).learner_spec)
    groups = make_groups(tiny_model_dir, n_groups=2, n=2)
    before = _seq_logprob(learner, groups[0])
    metrics = learner.step(groups)
    after = _seq_logprob(learner, groups[0])
    rewards = groups[0].rewards
    assert rewards == [0.0, 1.0]
    assert after[1] > before[1] and after[0] < before[0]
    assert learner.version == 1
    assert all(math.isfinite(v) for v in metrics.values())


def test_on_policy_batch_has_unit_is_weights_and_full_ess(tiny_model_dir: Path) -> None:
    learner = build(recipe_for(tiny_model_dir).learner_spec)
    m = learner.step(make_groups(tiny_model_dir, n_groups=2, n=3, version=0))
    assert m["vcpo/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["vcpo/is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert m["vcpo/ess_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert m["vcpo/lr_scale"] == pytest.approx(1.0, abs=1e-6)
    assert m["vcpo/kl_behavior_current"] == pytest.approx(0.0, abs=1e-6)
    assert m["learner/staleness_max"] == 0.0
    for key in (
        "learner/loss",
        "learner/grad_norm",
        "learner/lr",
        "learner/tokens",
        "perf/learner_tokens_per_s",
    ):
        assert key in m


def test_stale_batch_lowers_ess_and_lr(tiny_model_dir: Path) -> None:
    learner = build(recipe_for(tiny_model_dir, algorithm={"ess_base_ratio": 1.0}).learner_spec)
    learner.version = 3
    m = learner.step(make_groups(tiny_model_dir, n_groups=2, n=4, noise=0.05, version=1))
    assert m["vcpo/ess_ratio"] < 0.99
    assert m["vcpo/lr_scale"] == pytest.approx(math.sqrt(m["vcpo/ess_ratio"]), rel=1e-6)
    assert m["learner/staleness_mean"] == 2.0
    assert m["vcpo/kl_behavior_current"] > 0


def test_save_load_continues_bit_for_bit(tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe = recipe_for(
        tiny_model_dir, learner={"lr_schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}
    )
    b1, b2 = make_groups(tiny_model_dir, seed=1), make_groups(tiny_model_dir, seed=2)
    a = build(recipe.learner_spec)
    a.step(b1)
    a.save(tmp_path / "ckpt")
    m_a = a.step(b2)
    b = build(recipe.learner_spec)
    b.load(tmp_path / "ckpt")
    assert b.version == 1
    m_b = b.step(b2)
    assert m_a["learner/lr"] == m_b["learner/lr"] and m_a["learner/loss"] == m_b["learner/loss"]
    sa, sb = a.hf_state_dict(), b.hf_state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize(
    ("learner", "algorithm", "model_dtype"),
    [
        (
            {"dtype": "bfloat16", "gradient_checkpointing": True, "lr_schedule": "linear"},
            {"opob_mode": "proxy"},
            "bfloat16",
        ),
        ({"micro_batch_size": 1}, {"loss": "m2po", "advantage": "rloo"}, "float32"),
    ],
)
def test_other_settings_step_with_finite_metrics(
    tiny_model_dir: Path, learner: dict, algorithm: dict, model_dtype: str
) -> None:
    lrn = build(
        recipe_for(tiny_model_dir, learner=learner, algorithm=algorithm, model_dtype=model_dtype).learner_spec
    )
    m = lrn.step(make_groups(tiny_model_dir, n_groups=2, n=2, noise=0.02))
    assert all(math.isfinite(v) for v in m.values())
    assert m["learner/grad_norm"] > 0
    # engines get the recipe's model dtype; the master weights stay fp32
    assert all(v.dtype == getattr(torch, model_dtype) for v in lrn.hf_state_dict().values())
    assert all(p.dtype == torch.float32 for p in lrn.local.model.parameters())


def test_bad_settings_fail_at_build(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="advantage='opob' needs a loss with one weight per trajectory"):
        build(recipe_for(tiny_model_dir, algorithm={"loss": "ppo_clip", "advantage": "opob"}).learner_spec)
    with pytest.raises(ValueError, match="learner.dp=4 but train.batch_prompts=2"):
        build(recipe_for(tiny_model_dir, learner={"dp": 4}).learner_spec)


@pytest.mark.slow
@pytest.mark.heavy  # ~1 min: make test-heavy (make test's 30-minute budget); test_learner_dp.py covers dp=2 in make test
def test_dp2_on_ray_actors_equals_dp1(tiny_model_dir: Path, tmp_path: Path) -> None:
    import os

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    groups = make_groups(tiny_model_dir, n_groups=2, n=2, noise=0.02)
    one = build(recipe_for(tiny_model_dir, learner=CPU).learner_spec)  # CPU: as the two actors (no GPU asked)
    m1 = one.step(groups)
    one.save(tmp_path / "one")
    # a private local instance: without address="local", ray.init joins a cluster an earlier test or a dead
    # `ray start` left in Ray's temp dir, and refuses num_cpus (make test-slow, after tests/cluster, did)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        two = build(recipe_for(tiny_model_dir, learner={"dp": 2, **CPU}).learner_spec)
        assert type(two.pool).__name__ == "RayPool"
        m2 = two.step(groups)
        two.save(tmp_path / "two")
        two.close()
    finally:
        ray.shutdown()
    assert m2["learner/grad_norm"] == pytest.approx(m1["learner/grad_norm"], rel=1e-5)
    g1, g2 = first_gradient(tmp_path / "one"), first_gradient(tmp_path / "two")
    for k in g1:  # the bound of test_learner_dp.py: fp32 sums over the batch in another order
        torch.testing.assert_close(g2[k], g1[k], rtol=0, atol=1e-5 * float(g1[k].abs().max()))


def test_all_masked_batch_is_skipped_without_touching_weights(tiny_model_dir: Path) -> None:
    learner = build(recipe_for(tiny_model_dir).learner_spec)
    groups = make_groups(tiny_model_dir, n_groups=2, n=2)
    for g in groups:
        for t in g.trajectories:
            t.masked = True
    before = learner.hf_state_dict()
    m = learner.step(groups)
    assert m["learner/skipped"] == 1.0 and learner.version == 0
    after = learner.hf_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def _flat(groups: list, reward: float) -> list:
    """The same groups with every reward `reward`: each group's rewards equal, so every advantage is 0."""
    for g in groups:
        for t in g.trajectories:
            t.reward = reward
    return groups


@pytest.mark.parametrize("skip", [True, False])
def test_a_batch_without_a_reward_signal_takes_no_optimizer_step(tiny_model_dir: Path, skip: bool) -> None:
    """After a step on a batch with a signal, a batch whose groups' rewards are all equal has a zero gradient; with
    algorithm.skip_no_signal (the main job's setting) the weights and version stay; without it AdamW's momentum still moves
    the weights (the drift the setting exists to stop)."""
    learner = build(recipe_for(tiny_model_dir, algorithm={"skip_no_signal": skip}).learner_spec)
    learner.step(make_groups(tiny_model_dir, n_groups=2, n=2))  # rewards 0/1 in each group: a signal
    before = learner.hf_state_dict()
    m = learner.step(_flat(make_groups(tiny_model_dir, n_groups=2, n=2, seed=1), reward=1.0))
    after = learner.hf_state_dict()
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    if skip:
        assert m["learner/skipped"] == 1.0 and m["learner/no_signal"] == 1.0 and learner.version == 1
        assert unchanged
    else:
        assert m["learner/skipped"] == 0.0 and m["learner/grad_norm"] == 0.0 and learner.version == 2
        assert not unchanged, "AdamW with a zero gradient and non-zero momentum moves the weights"


def test_one_group_with_a_signal_is_enough_to_step(tiny_model_dir: Path) -> None:
    learner = build(recipe_for(tiny_model_dir, algorithm={"skip_no_signal": True}).learner_spec)
    groups = _flat(make_groups(tiny_model_dir, n_groups=2, n=2), reward=0.0)
    groups[1].trajectories[0].reward = 1.0
    m = learner.step(groups)
    assert m["learner/skipped"] == 0.0 and m["learner/no_signal"] == 0.0 and learner.version == 1


def test_proxy_group_held_under_checkpointing_gives_the_update_of_the_forward_only_baseline(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Proxy OPOB with one trajectory per micro-batch and groups of 2: under gradient checkpointing the learner
    keeps both graphs of a group until its baseline is known (vcpo StepConfig.proxy_hold_group); without, or
    with learner.proxy_hold_group: false, it runs a forward without gradients for the baseline first. The same
    update either way."""
    groups = make_groups(tiny_model_dir, n_groups=2, n=2, noise=0.05)
    runs = {"plain": (False, True), "held": (True, True), "unheld": (True, False)}  # (checkpointing, hold)
    for name, (ckpt, hold) in runs.items():
        lrn = build(
            recipe_for(
                tiny_model_dir,
                learner={"micro_batch_size": 1, "gradient_checkpointing": ckpt}
                | ({} if hold else {"proxy_hold_group": False}),
                algorithm={"opob_mode": "proxy"},
            ).learner_spec
        )
        assert lrn.local._step.cfg.proxy_hold_group is (ckpt and hold)
        lrn.step(groups)
        lrn.save(tmp_path / name)
    plain = first_gradient(tmp_path / "plain")
    tokens = max(len(t) for g in groups for t in g.trajectories)
    for name in ("held", "unheld"):
        other = first_gradient(tmp_path / name)
        for k in plain:
            # the baseline comes from log-probs of another forward (with or without autograd: on another machine
            # possibly another kernel): each trajectory's log importance weight within sum_atol(tokens), which
            # moves its weight, hence its share of the gradient, by that relative amount
            scale = float(plain[k].abs().max())
            assert scale > 0, k
            torch.testing.assert_close(other[k], plain[k], rtol=0, atol=sum_atol(tokens) * scale, msg=name)
