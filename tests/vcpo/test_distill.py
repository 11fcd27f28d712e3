"""On-policy distillation in the vcpo step: the reverse-KL term's gradient, its IS weight, its metrics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from vcpo_testlib import make_batch, tiny_model

from vcpo import BatchError, PolicyBatch, Step, StepConfig, logprobs_of
from vcpo.distill import DistillConfig

NO_CLIP = 1e9
# float64 everywhere: sums of a few dozen terms of size <= 10 agree to ~1e-14; 1e-10 leaves room for any
# reduction order and stays far below the size of the gradients compared (>= 1e-3).
TOL = 1e-10


class TableLM(nn.Module):
    """The logits at position t are a free parameter row Z[t] (the same for every row of the batch): the gradient
    of log softmax(Z[t-1])[y_t] with respect to Z[t-1] is e_y − softmax(Z[t-1]), by hand."""

    def __init__(self, width: int, vocab: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.z = nn.Parameter(torch.randn(width, vocab, generator=g, dtype=torch.float64))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        return SimpleNamespace(logits=self.z[: input_ids.shape[1]].expand(input_ids.shape[0], -1, -1))


def _sgd_update(model: nn.Module, batch: PolicyBatch, **cfg: object) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's gradient, read off one SGD(lr=1) step with no clipping and no ESS damping."""
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    m = Step(model, opt, StepConfig(ess_lr_rule="none", grad_clip=NO_CLIP, **cfg))(batch)  # type: ignore[arg-type]
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return before - after, m.as_dict()


def _toy(shift: float) -> tuple[TableLM, PolicyBatch]:
    """Two trajectories over a 4-token table; the behaviour log-probs of row 1 are `shift` per token below the
    current ones (a sampler k versions old), so its sequence weight is exp(3 * shift) before truncation."""
    model = TableLM(width=5, vocab=6)
    ids = torch.tensor([[0, 3, 1, 5, 2], [4, 2, 2, 0, 0]])
    am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    lm = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float64)
    with torch.no_grad():
        cur = logprobs_of(model, ids, am).double()
    blp = torch.where(lm > 0, cur, 0.0)
    blp[1] = torch.where(lm[1] > 0, cur[1] - shift, 0.0)
    teacher = torch.tensor([[0, -3.5, -0.5, -3.0, -1.7], [0, -0.3, -3.2, -0.4, 0]], dtype=torch.float64)
    batch = PolicyBatch(
        ids, am, lm, blp, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), teacher_logprobs=teacher
    )
    return model, batch


def _hand_gradient(model: TableLM, batch: PolicyBatch, beta: float, log_w: list[float]) -> torch.Tensor:
    """∂/∂Z of (1/N) Σ_i β w̃_i mean_t k_t log π_t (k_t held fixed): row t-1 of Z gets, from token t of row i,
    (β/N) w̃_i (1/L_i) k_t (e_{y_t} − softmax(Z[t-1]))."""
    z = model.z.detach()
    grad = torch.zeros_like(z)
    n = batch.size
    for i in range(n):
        mask = batch.loss_mask[i]
        L = float(mask.sum())
        for t in range(1, batch.input_ids.shape[1]):
            if mask[t] == 0:
                continue
            p = z[t - 1].softmax(-1)
            y = int(batch.input_ids[i, t])
            k = float(p[y].log()) - float(batch.teacher_logprobs[i, t])  # type: ignore[index]
            e = torch.zeros_like(p)
            e[y] = 1.0
            grad[t - 1] += beta / n * math.exp(log_w[i]) / L * k * (e - p)
    return grad.flatten()


@pytest.mark.parametrize("mode", ["reward", "loss"])
@pytest.mark.parametrize(
    ("loss", "shift", "row1_log_weight"),
    [
        ("vcpo", 0.5, 1.5),  # w = e^{1.5} = 4.5 < c = 8: kept whole
        ("vcpo", 1.0, math.log(8.0)),  # w = e^3 = 20 > c: truncated to c = 8
        ("mis", 1.0, -math.inf),  # w > c: rejected, weight 0
        ("reinforce", 1.0, 0.0),  # no correction: weight 1
    ],
)
def test_kl_gradient_matches_the_hand_computed_one_with_the_losses_is_weight(
    mode: str, loss: str, shift: float, row1_log_weight: float
) -> None:
    model, batch = _toy(shift)
    beta = 0.7
    want = _hand_gradient(model, batch, beta, [0.0, row1_log_weight])
    got, _ = _sgd_update(
        model,
        batch,
        loss=loss,
        advantage="grpo",
        distill=DistillConfig(mode=mode, weight=beta, task_weight=0.0),
    )
    assert torch.allclose(got, want, rtol=0, atol=TOL), (got - want).abs().max()
    assert float(want.abs().max()) > 1e-3  # the comparison is not between two zeros


def test_reward_and_loss_forms_give_the_same_update() -> None:
    model = tiny_model(0)
    batch = make_batch(model, staleness=0.3, seed=4)
    g = torch.Generator().manual_seed(9)
    teacher = torch.where(
        batch.loss_mask > 0, -torch.rand(batch.input_ids.shape, generator=g, dtype=torch.float64) * 3, 0.0
    )
    batch = PolicyBatch(*batch._fields(), teacher_logprobs=teacher)
    ups = []
    for mode in ("reward", "loss"):
        m = tiny_model(0)
        ups.append(
            _sgd_update(m, batch, advantage="grpo", distill=DistillConfig(mode=mode, task_weight=0.0))[0]
        )
    assert torch.allclose(ups[0], ups[1], rtol=0, atol=TOL)
    assert float(ups[0].abs().max()) > 1e-4


@pytest.mark.parametrize("mode", ["reward", "loss"])
@pytest.mark.parametrize("task_weight", [0.0, 1.0])
def test_a_teacher_equal_to_the_student_gives_reverse_kl_0_and_no_update(
    mode: str, task_weight: float
) -> None:
    model = tiny_model(0)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 24, (6, 10), generator=g)
    am = torch.ones_like(ids)  # full rows: the step's forward sees exactly these shapes, so its log-probs are
    lm = (torch.arange(10)[None, :] >= 3).double().expand(6, -1).clone()  # bit for bit the ones below
    with torch.no_grad():
        cur = logprobs_of(model, ids, am).double()
    blp = torch.where(lm > 0, cur, 0.0)  # on-policy
    rewards = torch.ones(6, dtype=torch.float64)  # equal rewards in every group: the task advantage is 0 too
    batch = PolicyBatch(
        ids, am, lm, blp, rewards, torch.tensor([0, 0, 0, 1, 1, 1]), teacher_logprobs=blp.clone()
    )
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    cfg = StepConfig(
        advantage="grpo", micro_batch_size=6, distill=DistillConfig(mode=mode, task_weight=task_weight)
    )
    m = Step(model, opt, cfg)(batch).as_dict()
    assert m["distill/reverse_kl"] == 0.0 and m["distill/disagree_frac"] == 0.0
    assert m["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_exact_opob_adds_the_distillation_gradient_to_the_task_gradient() -> None:
    model = tiny_model(0)
    batch = make_batch(model, staleness=0.2, seed=5)
    teacher = torch.where(batch.loss_mask > 0, batch.behavior_logprobs - 0.3, 0.0)
    batch = PolicyBatch(*batch._fields(), teacher_logprobs=teacher)
    exact = dict(advantage="opob", opob_mode="exact")
    task = _sgd_update(tiny_model(0), batch, **exact)[0]
    distill = _sgd_update(tiny_model(0), batch, advantage="grpo", distill=DistillConfig(task_weight=0.0))[0]
    both = _sgd_update(tiny_model(0), batch, **exact, distill=DistillConfig(task_weight=1.0))[0]
    assert torch.allclose(both, task + distill, rtol=0, atol=TOL)
    half = _sgd_update(tiny_model(0), batch, **exact, distill=DistillConfig(weight=0.5, task_weight=2.0))[0]
    assert torch.allclose(half, 2 * task + 0.5 * distill, rtol=0, atol=TOL)


def test_distillation_metrics_are_per_loss_token_averages() -> None:
    model, batch = _toy(0.0)
    with torch.no_grad():
        cur = logprobs_of(model, batch.input_ids, batch.attention_mask).double()
    mask = batch.loss_mask > 0
    k = (cur - batch.teacher_logprobs)[mask]  # type: ignore[operator]
    threshold = 0.5  # the toy's k: two tokens above it, five below
    _, m = _sgd_update(model, batch, advantage="grpo", distill=DistillConfig(disagree_threshold=threshold))
    assert m["distill/reverse_kl"] == pytest.approx(float(k.mean()), abs=1e-12)
    assert m["distill/teacher_logprob"] == pytest.approx(
        float(batch.teacher_logprobs[mask].mean()), abs=1e-12
    )  # type: ignore[index]
    assert m["distill/behavior_logprob"] == pytest.approx(
        float(batch.behavior_logprobs[mask].mean()), abs=1e-12
    )
    assert m["distill/disagree_frac"] == pytest.approx(float((k > threshold).double().mean()), abs=1e-12)
    assert 0 < m["distill/disagree_frac"] < 1


def test_a_distilling_step_refuses_a_batch_without_teacher_logprobs() -> None:
    model = tiny_model(0)
    batch = make_batch(model)
    step = Step(model, torch.optim.SGD(model.parameters(), lr=1.0), StepConfig(distill=DistillConfig()))
    with pytest.raises(BatchError, match="no teacher_logprobs"):
        step(batch)


def test_a_nan_teacher_logprob_on_a_loss_token_is_refused_with_its_position() -> None:
    model, batch = _toy(0.0)
    batch.teacher_logprobs[1, 2] = math.nan  # type: ignore[index]
    with pytest.raises(
        BatchError, match=r"teacher_logprobs must be finite and <= 0 on loss tokens: row 1, position 2"
    ):
        batch.validate()


def test_distill_config_refuses_a_term_that_trains_nothing() -> None:
    with pytest.raises(ValueError, match="both 0"):
        DistillConfig(weight=0.0, task_weight=0.0).check()
    with pytest.raises(ValueError, match="mode"):
        DistillConfig(mode="forward").check()
