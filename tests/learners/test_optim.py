"""The learners' AdamW (agent_rl/learners/_optim.py): fused, the same update as torch's default (foreach) up to
float rounding, no decay on 1-D parameters, and a checkpoint written by the foreach one resumes fused."""

from __future__ import annotations

import torch

from agent_rl.learners._optim import adamw, load_adamw_state

EPS = torch.finfo(torch.float32).eps
LR = 1e-2


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(64, 32, generator=g)),
        torch.nn.Parameter(torch.randn(32, generator=g)),
    ]


def _grads(params, steps: int, seed: int = 1) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=g) for p in params] for _ in range(steps)]


def _train(opt: torch.optim.Optimizer, params, grads) -> None:
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = g.clone()
        opt.step()


def test_the_learners_adamw_is_fused_and_decays_only_matrices():
    params = _params()
    opt = adamw(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    assert all(group["fused"] for group in opt.param_groups)
    decay, no_decay = opt.param_groups
    assert [p.dim() for p in decay["params"]] == [2] and decay["weight_decay"] == 0.1
    assert [p.dim() for p in no_decay["params"]] == [1] and no_decay["weight_decay"] == 0.0


def test_fused_update_equals_the_foreach_one_up_to_rounding():
    fused, ref = _params(), _params()
    grads = _grads(fused, steps=5)
    _train(adamw(fused, lr=LR, betas=(0.9, 0.95), weight_decay=0.1), fused, grads)
    decay, no_decay = [p for p in ref if p.dim() >= 2], [p for p in ref if p.dim() < 2]
    foreach = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=(0.9, 0.95), foreach=True,
    )  # fmt: skip
    _train(foreach, ref, grads)
    for a, b in zip(fused, ref, strict=True):
        # each step rounds the new weight once (half an ulp of |p|: rtol) after an update of size ~lr computed
        # in another order (a few ulps of lr: atol); 5 steps
        torch.testing.assert_close(a, b, rtol=5 * EPS, atol=5 * 8 * LR * EPS)
    assert not all(torch.equal(a, b) for a, b in zip(fused, _params(), strict=True))  # it did train


def test_a_foreach_checkpoint_resumes_fused_with_its_moments():
    old_params = _params()
    old = torch.optim.AdamW(old_params, lr=LR, foreach=True)
    _train(old, old_params, _grads(old_params, steps=2))
    state = old.state_dict()
    assert state["param_groups"][0]["foreach"] is True

    params = _params()
    opt = adamw(params, lr=LR, betas=(0.9, 0.999), weight_decay=0.0)
    state["param_groups"] = [
        dict(state["param_groups"][0], params=[0]),
        dict(state["param_groups"][0], params=[1]),
    ]
    load_adamw_state(opt, state)
    assert all(group["fused"] is True and group["foreach"] is None for group in opt.param_groups)
    for p, q in zip(params, old_params, strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], old.state[q]["exp_avg"])
    _train(opt, params, _grads(params, steps=1))  # and it steps
