"""The step driver: exact OPOB equals an explicit per-trajectory implementation; DP equals single process."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from vcpo_testlib import F64_ATOL, F64_RTOL, make_batch, run_gloo, tiny_model

from vcpo import PolicyBatch, Step, StepConfig, logit_grad_proxy_of, logprobs_of

NO_CLIP = 1e9


def _flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _update(model: nn.Module, batch: PolicyBatch, **cfg: object) -> tuple[torch.Tensor, object]:
    """-(parameter change) of one SGD(lr=1) step without damping or clipping: the step's gradient."""
    before = _flat_params(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    metrics = Step(model, opt, StepConfig(ess_lr_rule="none", grad_clip=NO_CLIP, **cfg))(batch)  # type: ignore[arg-type]
    return before - _flat_params(model), metrics


def _explicit_opob_gradient(
    model: nn.Module, batch: PolicyBatch, c: float, variant: str, proxy: bool
) -> torch.Tensor:
    """Stores every per-trajectory gradient g_i, then forms −(1/N) Σ w̃_i (R_i − b_g)/σ_g g_i directly."""
    params = list(model.parameters())
    gs, gsq, s, tokens = [], [], [], []
    for i in range(batch.size):
        lp = logprobs_of(model, batch.input_ids[i : i + 1], batch.attention_mask[i : i + 1])[0]
        m = batch.loss_mask[i]
        mean_lp = (lp * m).sum() / m.sum()
        g = torch.cat([x.flatten() for x in torch.autograd.grad(mean_lp, params)])
        gs.append(g)
        s.append(float(((lp.detach().double() - batch.behavior_logprobs[i]) * m).sum()))
        tokens.append(float(m.sum()))
        if proxy:  # Σ_t ‖e_y − softmax‖² over loss tokens, / L² for the token mean
            with torch.no_grad():
                logits = model(batch.input_ids[i : i + 1]).logits[0, :-1]
                e = torch.nn.functional.one_hot(batch.input_ids[i, 1:], logits.shape[-1]).double()
                per_tok = ((e - logits.softmax(-1)) ** 2).sum(-1)
            gsq.append(float((per_tok * m[1:]).sum()) / tokens[-1] ** 2)
        else:
            gsq.append(float(g @ g))
    grad = torch.zeros_like(gs[0])
    for gval in batch.group_index.unique().tolist():
        members = (batch.group_index == gval).nonzero().flatten().tolist()
        r = batch.rewards[members].double()
        sigma = float(r.std(unbiased=False))
        wt = [min(math.exp(s[i]), c) for i in members]
        if variant == "default":
            v = [wt[k] ** 2 * gsq[i] for k, i in enumerate(members)]
        else:
            v = [wt[k] ** 2 * math.exp(2 * s[i]) * tokens[i] ** 2 * gsq[i] for k, i in enumerate(members)]
        b = sum(vk * float(r[k]) for k, vk in enumerate(v)) / sum(v)
        for k, i in enumerate(members):
            grad -= wt[k] * (float(r[k]) - b) / sigma * gs[i]
    return grad / batch.size


@pytest.mark.parametrize("variant", ["default", "reference"])
def test_exact_two_running_sums_equal_explicit_per_trajectory_gradients(variant: str) -> None:
    model = tiny_model()
    batch = make_batch(model, staleness=0.4)
    expected = _explicit_opob_gradient(tiny_model(), batch, c=1.5, variant=variant, proxy=False)
    got, metrics = _update(model, batch, is_truncation=1.5, opob_weight=variant, opob_mode="exact")
    assert torch.allclose(got, expected, rtol=F64_RTOL, atol=F64_ATOL), float((got - expected).abs().max())
    assert metrics.clip_fraction > 0  # truncation at 1.5 was active, so w̃ != w was exercised
    assert metrics.traj_grad_norm_max >= metrics.traj_grad_norm_mean > 0


def test_proxy_mode_equals_explicit_implementation_with_logit_gradient_norms() -> None:
    model = tiny_model()
    batch = make_batch(model, staleness=0.4)
    expected = _explicit_opob_gradient(tiny_model(), batch, c=1.5, variant="default", proxy=True)
    # whole group in one forward; a group split over micro-batches, with a forward-only pass for its baseline or
    # with its graphs held until the baseline is known
    for mbs, hold in ((4, False), (2, False), (2, True)):
        got, _ = _update(
            tiny_model(),
            batch,
            is_truncation=1.5,
            opob_mode="proxy",
            micro_batch_size=mbs,
            proxy_hold_group=hold,
        )
        assert torch.allclose(got, expected, rtol=F64_RTOL, atol=F64_ATOL), (
            mbs,
            hold,
            float((got - expected).abs().max()),
        )


@pytest.mark.parametrize("hold", [False, True])
def test_proxy_group_split_over_micro_batches_forwards_once_per_part_when_it_holds_the_graphs(
    hold: bool,
) -> None:
    model = tiny_model()
    batch = make_batch(model, staleness=0.4)
    forwards = {"grad": 0, "no_grad": 0, "logprob": 0}

    def proxy_fn(m: nn.Module, ids: torch.Tensor, am: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        forwards["grad" if torch.is_grad_enabled() else "no_grad"] += 1
        return logit_grad_proxy_of(m, ids, am)

    def logprob_fn(m: nn.Module, ids: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
        forwards["logprob"] += 1
        return logprobs_of(m, ids, am)

    cfg = StepConfig(opob_mode="proxy", micro_batch_size=2, proxy_hold_group=hold, ess_lr_rule="none")
    Step(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, logprob_fn=logprob_fn, proxy_fn=proxy_fn)(
        batch
    )
    parts = sum(
        -(-int(n) // 2) for n in batch.group_index.unique(return_counts=True)[1]
    )  # groups of 4: 2 parts
    if hold:  # one forward with gradients per part, nothing else
        assert forwards == {"grad": parts, "no_grad": 0, "logprob": 0}
    else:  # a forward-only pass per part for the baseline, then a forward with gradients per part
        assert forwards == {"grad": 0, "no_grad": parts, "logprob": parts}


def test_exact_and_chunked_paths_agree_when_the_baseline_is_the_same() -> None:
    # With all norms equal the OPOB weights are w̃² only, same in both modes: the updates must match.
    model = tiny_model()
    batch = make_batch(model)
    a, _ = _update(tiny_model(), batch, loss="reinforce", advantage="grpo")
    b, _ = _update(tiny_model(), batch, loss="tis_seq", advantage="grpo", is_truncation=1e6)
    assert not torch.allclose(a, b)  # IS weights matter
    c, _ = _update(tiny_model(), batch, loss="vcpo", advantage="grpo", is_truncation=1e6, micro_batch_size=5)
    assert torch.allclose(b, c, rtol=F64_RTOL, atol=F64_ATOL)  # micro-batching does not change the update


class _RecordingSGD(torch.optim.SGD):
    def __init__(self, params, fail: bool = False) -> None:  # noqa: ANN001
        super().__init__(params, lr=0.1)
        self.seen: list[float] = []
        self.fail = fail

    def step(self, closure=None):  # noqa: ANN001, ANN201
        self.seen.append(self.param_groups[0]["lr"])
        if self.fail:
            raise RuntimeError("optimizer failed")
        return super().step(closure)


@pytest.mark.parametrize(
    "cfg",
    [
        {"loss": "ppo_clip", "advantage": "grpo"},
        {"loss": "m2po", "advantage": "rloo"},  # a forward-only prepare pass first
        {"loss": "vcpo", "advantage": "opob", "opob_mode": "proxy", "is_truncation": 1.5},
    ],
    ids=["grpo", "m2po-prepare", "proxy-opob"],
)
def test_token_budget_micro_batches_stay_within_it_and_give_the_same_update(cfg: dict) -> None:
    batch = make_batch(tiny_model(), staleness=0.4)
    lengths = batch.attention_mask.sum(-1)
    budget = int(lengths.max()) + 2  # rows of very different length: one or two per micro-batch
    seen: list[int] = []  # real tokens of every multi-row forward (a lone row may exceed the budget)

    def record(am: torch.Tensor) -> None:
        seen.append(int(am.sum()) if am.shape[0] > 1 else 0)

    def logprob_fn(m: nn.Module, ids: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
        record(am)
        return logprobs_of(m, ids, am)

    def proxy_fn(m: nn.Module, ids: torch.Tensor, am: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        record(am)
        return logit_grad_proxy_of(m, ids, am)

    ref, _ = _update(tiny_model(), batch, micro_batch_size=batch.size, **cfg)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = _flat_params(model)
    step_cfg = StepConfig(
        ess_lr_rule="none", grad_clip=NO_CLIP, micro_batch_size=batch.size, micro_batch_tokens=budget, **cfg
    )
    Step(model, opt, step_cfg, logprob_fn=logprob_fn, proxy_fn=proxy_fn)(batch)
    assert len(seen) > 2 and max(seen) <= budget
    got = before - _flat_params(model)
    assert torch.allclose(got, ref, rtol=F64_RTOL, atol=F64_ATOL), float((got - ref).abs().max())


def test_lr_is_scaled_for_the_step_only_and_restored() -> None:
    model = tiny_model()
    batch = make_batch(model, staleness=1.0)
    opt = _RecordingSGD(model.parameters())
    metrics = Step(model, opt, StepConfig(opob_mode="proxy"))(batch)
    assert metrics.lr_scale < 1.0
    assert opt.seen == [pytest.approx(0.1 * metrics.lr_scale)] and metrics.lr == pytest.approx(opt.seen[0])
    assert metrics.lr_scale == pytest.approx(math.sqrt(metrics.ess_ratio))
    assert opt.param_groups[0]["lr"] == 0.1
    assert all(p.grad is None for p in model.parameters())
    failing = _RecordingSGD(model.parameters(), fail=True)
    with pytest.raises(RuntimeError, match="optimizer failed"):
        Step(model, failing, StepConfig(opob_mode="proxy"))(batch)
    assert failing.param_groups[0]["lr"] == 0.1


def test_extreme_log_ratios_give_a_finite_ess_and_a_damped_step_never_nan() -> None:
    model = tiny_model()
    batch = make_batch(model, groups=2, per_group=4)
    first = batch.loss_mask[0].nonzero()[0, 0]
    batch.behavior_logprobs[0, first] = -1e4  # s_0 ≈ +1e4: w overflows float64
    batch.behavior_logprobs[5, first] = -1e-3
    for mode in ("exact", "proxy"):
        for loss in ("vcpo", "mis", "reinforce"):
            m = tiny_model()
            metrics = Step(
                m, torch.optim.AdamW(m.parameters(), lr=1e-2), StepConfig(loss=loss, opob_mode=mode)
            )(batch)
            assert all(math.isfinite(v) for v in metrics.as_dict().values()), (mode, loss, metrics)
            assert metrics.ess == pytest.approx(1.0) and metrics.lr_scale == pytest.approx(math.sqrt(1 / 8))
            assert metrics.ess_ratio_truncated > 2 * metrics.ess_ratio  # min(w, 8) tames the dominant weight
            assert metrics.log_ratio_abs_max > 9e3
            assert torch.isfinite(_flat_params(m)).all()
    for loss in ("tis_token", "icepop", "m2po", "ppo_clip", "gspo", "cispo"):
        m = tiny_model()
        cfg = StepConfig(loss=loss, advantage="rloo")
        metrics = Step(m, torch.optim.AdamW(m.parameters(), lr=1e-2), cfg)(batch)
        assert (
            all(math.isfinite(v) for v in metrics.as_dict().values())
            and torch.isfinite(_flat_params(m)).all()
        )


def test_config_errors_name_the_field_and_the_fix() -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="advantage='opob' needs a loss with one weight per trajectory"):
        Step(model, opt, StepConfig(loss="ppo_clip"))
    with pytest.raises(ValueError, match="unknown loss 'ppo'"):
        Step(model, opt, StepConfig(loss="ppo"))
    with pytest.raises(
        ValueError, match=r"does not take \['clip'\]; its loss_kwargs are: clip_low, clip_high"
    ):
        Step(model, opt, StepConfig(loss="ppo_clip", advantage="grpo", loss_kwargs={"clip": 0.1}))
    with pytest.raises(ValueError, match="opob_mode = 'fast'"):
        Step(model, opt, StepConfig(opob_mode="fast"))
    with pytest.raises(ValueError, match="custom logprob_fn also needs proxy_fn"):
        Step(model, opt, StepConfig(opob_mode="proxy"), logprob_fn=lambda m, i, a: logprobs_of(m, i, a))


def test_batch_errors_name_field_row_and_value() -> None:
    model = tiny_model()
    batch = make_batch(model)
    batch.loss_mask[2, 0] = 1.0
    step = Step(model, torch.optim.SGD(model.parameters(), lr=0.1), StepConfig())
    with pytest.raises(ValueError, match="loss_mask is 1 at position 0.*row 2"):
        step(batch)
    batch = make_batch(model)
    batch.behavior_logprobs[1, 5] = math.nan
    with pytest.raises(ValueError, match="behavior_logprobs must be finite.*row 1, position 5"):
        step(batch)


# -- data parallel ----------------------------------------------------------------------------

DP_CONFIGS = {
    "exact": {"opob_mode": "exact", "is_truncation": 1.5},
    "proxy": {"opob_mode": "proxy", "micro_batch_size": 4},
    "m2po": {"loss": "m2po", "advantage": "grpo", "loss_kwargs": {"tau": 0.02}},
}


def _run(model: nn.Module, batch: PolicyBatch, name: str, group: object = None) -> tuple[torch.Tensor, dict]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = Step(model, opt, StepConfig(grad_clip=0.5, **DP_CONFIGS[name]), dp_group=group)(batch)  # type: ignore[arg-type]
    return _flat_params(model), metrics.as_dict()


def _rank_rows(batch: PolicyBatch, rank: int) -> torch.Tensor:
    return (batch.group_index % 2 == rank).nonzero().flatten()  # groups 0, 2 on rank 0; 1 on rank 1


def _dp_worker(rank: int, world: int, out: str) -> None:
    results = {}
    for name in DP_CONFIGS:
        model = tiny_model()
        batch = make_batch(model, staleness=0.4)
        rows = _rank_rows(batch, rank)
        local = PolicyBatch(*(t[rows] for t in batch._fields()))
        if name == "proxy":  # through DDP; the others with a plain module and dp_group
            results[name] = _run(nn.parallel.DistributedDataParallel(model), local, name)
        else:
            results[name] = _run(model, local, name, dist.group.WORLD)
    torch.save(results, f"{out}.{rank}")


def test_two_gloo_ranks_give_the_same_update_and_metrics_as_one_process(tmp_path) -> None:  # noqa: ANN001
    out = str(tmp_path / "dp")
    run_gloo(_dp_worker, 2, out)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for name in DP_CONFIGS:
        model = tiny_model()
        params, metrics = _run(model, make_batch(model, staleness=0.4), name)
        for r in ranks:
            got_params, got_metrics = r[name]
            assert torch.allclose(got_params, params, rtol=F64_RTOL, atol=F64_ATOL), name
            for k, v in metrics.items():
                assert got_metrics[k] == pytest.approx(v, rel=F64_RTOL, abs=F64_ATOL), (name, k)
