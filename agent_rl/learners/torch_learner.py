"""The torch rank kind: a Hugging Face causal LM trained with torch and the vcpo step, data parallel only.

`torch_kind(spec)` says how to build its ranks (`_torch_rank.TorchRank`) and talk to them; where they run
(this process, worker processes, Ray actors) is the pool's business (learners/__init__.py picks both). Rank r
steps on data-parallel share r; the ranks hold identical replicas, so rank 0 alone answers for the weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_rl.learners._torch_rank import RankSpec
from agent_rl.learners.kind import RankKind, one_share_each
from vcpo.distill import DistillConfig
from vcpo.step import StepConfig

if TYPE_CHECKING:
    from agent_rl.config import LearnerSpec
    from agent_rl.learners._torch_rank import TorchRank


def rank_spec(spec: LearnerSpec) -> RankSpec:
    """A rank's build spec: the learner spec with its vcpo step config (the loss/advantage pairing checked)."""
    lc, ac = spec.learner, spec.algorithm
    step = StepConfig(
        loss=ac.loss,
        advantage=ac.advantage,
        is_truncation=ac.is_truncation,
        ess_lr_rule=ac.ess_lr_rule,
        ess_base_ratio=ac.ess_base_ratio,
        opob_mode=ac.opob_mode,
        opob_weight=ac.opob_weight,
        opob_norms="backward" if lc.compile else ac.opob_norms,  # ghost hooks are not traced by torch.compile
        grad_clip=lc.grad_clip,
        micro_batch_size=lc.micro_batch_size,
        micro_batch_tokens=lc.micro_batch_tokens,
        # under recompute a held graph is only each layer's input: keep a group's graphs, skip a forward
        proxy_hold_group=lc.gradient_checkpointing in (True, "full") and lc.proxy_hold_group,
        loss_kwargs=dict(ac.loss_kwargs),
        distill=None
        if (t := ac.teacher) is None
        else DistillConfig(t.mode, t.weight, t.task_weight, t.disagree_threshold),
    )
    step.check()  # a bad loss/advantage pairing fails at build time, not at step 1
    return RankSpec(
        model_path=spec.model.path,
        weights_dtype=spec.model.dtype,
        compute_dtype=lc.dtype,
        lr=lc.lr,
        betas=lc.betas,
        weight_decay=lc.weight_decay,
        lr_schedule=lc.lr_schedule,
        warmup_steps=lc.warmup_steps,
        total_steps=spec.total_steps,
        gradient_checkpointing=lc.gradient_checkpointing,
        step=step,
        seed=spec.seed,
        lora=lc.lora,
        pack=lc.pack_sequences is not False,
        logprob_chunk_tokens=lc.logprob_chunk_tokens,
        compile=lc.compile,
        share_prefixes=lc.share_prefixes,
        routing_replay=ac.routing_replay,
        lm_head_fp32=spec.model.lm_head_fp32,
    )


def build_torch_rank(
    spec: RankSpec, rank: int, world: int, init_method: str | None, device: str
) -> TorchRank:
    """A `RankBuilder`: join the process group (none for the single rank of this process), build the rank."""
    import torch.distributed as dist

    from agent_rl.learners._pool import join_rank_group
    from agent_rl.learners._torch_rank import TorchRank

    if init_method is None:
        return TorchRank(spec, device=device)
    join_rank_group(rank, world, init_method, device)
    return TorchRank(spec, dp_group=dist.group.WORLD, device=device)


def _own_rows(answers: list[Any]) -> list[Any]:
    return answers  # rank r holds share r's rows


def torch_kind(spec: LearnerSpec) -> RankKind:
    """The torch learner's ranks for `spec` (learner.backend must be 'torch')."""
    if spec.learner.backend != "torch":
        raise ValueError(f"torch_kind: learner.backend is {spec.learner.backend!r}; this builds 'torch'")
    rs = rank_spec(spec)
    return RankKind(
        name="torch", spec=rs, build=build_torch_rank, world=spec.learner.dp, dp=spec.learner.dp,
        step_args=one_share_each, rows=_own_rows, lora=rs.lora is not None, routes=True,
    )  # fmt: skip
