"""The step reads the device a fixed number of times per step, however many micro-batches it runs: planning works
on Python ints read once, per-trajectory results stay on the device until the end of the step, and the checks
that need a value (finite log-ratios, proxy norms) run once on the host copy. On a GPU each read waits for the
device (the profile of the fourth H200 session found the torch learner's GPU busy 0.79 of its step against the
transformers + Liger anchor's 0.88, with ~20 reads per micro-batch). Counted here on the CPU (benchmarks/host_reads.py);
on CUDA with torch's sync debug mode."""

from __future__ import annotations

import pytest
import torch
from vcpo_testlib import make_batch, tiny_model

import vcpo
from benchmarks.host_reads import HostReads
from vcpo.distill import DistillConfig
from vcpo.logprobs import logit_grad_proxy_of, logprobs_of

CONFIGS = {
    "vcpo-proxy": dict(opob_mode="proxy"),
    "vcpo-proxy-held": dict(opob_mode="proxy", proxy_hold_group=True),
    "grpo-tis": dict(loss="tis_token", advantage="grpo", ess_lr_rule="none"),
    "m2po": dict(loss="m2po", advantage="grpo"),  # a forward-only pass over the batch first
    "distill": dict(opob_mode="proxy", distill=DistillConfig()),
}


def _reads(cfg: dict, micro_batch_size: int) -> HostReads:
    model = tiny_model(0)
    batch = make_batch(model, groups=3, per_group=4, seed=3)
    if "distill" in cfg:
        batch.teacher_logprobs = torch.where(batch.loss_mask > 0, batch.behavior_logprobs - 0.1, 0.0)
    with HostReads() as checks:  # the batch's own checks run where the learner builds it, on the host
        batch.validate()
    reads = HostReads()

    def logprobs(m, ids, am):  # noqa: ANN001, ANN202 — the model's function reads what it reads; not the step
        with reads.pause():
            return logprobs_of(m, ids, am)

    def proxy(m, ids, am):  # noqa: ANN001, ANN202
        with reads.pause():
            return logit_grad_proxy_of(m, ids, am)

    cfg = vcpo.StepConfig(micro_batch_size=micro_batch_size, **cfg)
    step = vcpo.Step(
        model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, logprob_fn=logprobs, proxy_fn=proxy
    )
    with reads:
        step(batch)
    assert reads.where[: checks.count] == checks.where, (reads.where, checks.where)
    del reads.where[: checks.count]
    return reads


@pytest.mark.parametrize("name", CONFIGS)
def test_the_step_reads_the_device_as_often_with_twelve_micro_batches_as_with_one(name: str) -> None:
    one, twelve = _reads(CONFIGS[name], 12), _reads(CONFIGS[name], 1)
    assert twelve.count == one.count, (
        f"one micro-batch: {one.count} reads at {one.where}; twelve: {twelve.count} at {twelve.where}"
    )
    # and none inside the micro-batch loop: the host's plan (_Host.of, 1 read), the rows copied once and checked
    # (on_cpu), the reduced statistics and the gradient norm (_finish, _distill_metrics), M2PO's threshold
    assert one.functions <= {"of", "on_cpu", "_finish", "_distill_metrics", "m2po_threshold", "_prepare"}, (
        one.where
    )


def test_a_nan_log_prob_is_refused_with_the_trajectory_and_no_update() -> None:
    model = tiny_model(0)
    batch = make_batch(model, groups=2, per_group=2, seed=3)
    before = [p.detach().clone() for p in model.parameters()]

    def nan_at_row_2(m, ids, am):  # noqa: ANN001, ANN202
        lp, gsq = logit_grad_proxy_of(m, ids, am)
        at = torch.zeros_like(ids, dtype=torch.bool)
        at[2, 5] = True  # a loss token (make_batch: rows of at least 6 tokens, loss from position 3)
        return torch.where(at, torch.nan, lp), gsq

    step = vcpo.Step(model, torch.optim.SGD(model.parameters(), lr=0.1),
                     vcpo.StepConfig(opob_mode="proxy"), proxy_fn=nan_at_row_2)  # fmt: skip
    with pytest.raises(ValueError, match=r"trajectory 2 has log-ratio nan.*no update was applied"):
        step(batch)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_on_cuda_the_learner_step_syncs_as_often_with_sixteen_forwards_as_with_one(tmp_path) -> None:
    """The torch learner's whole step (benchmarks/host_reads.py's cells) under torch's sync debug mode: beyond the
    log-probs' two per forward (the lengths, transformers' mask check), the step's own syncs do not grow."""
    from benchmarks.host_reads import LAYOUTS, SMALL, measure, write_model

    model = write_model(tmp_path / "small", SMALL, device="cuda")
    own = {}
    for name, rows, recompute in LAYOUTS:
        got = measure(model, rows, recompute, "cuda")
        own[name] = got["cuda_syncs"] - 2 * got["forwards"]
    assert len(set(own.values())) == 1, own
