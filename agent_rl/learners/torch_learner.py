"""The default learner: a Hugging Face causal LM trained with torch and the vcpo step.

dp=1 runs the rank in this process. dp>1 runs every rank in its own process: Ray actors
placed as placement.learner says when Ray is up (placement started or joined it), local
worker processes otherwise; gloo on CPU, NCCL on GPU. This facade splits the global batch
into whole groups per rank, the ranks step in lockstep (gradients summed once per step
inside vcpo), and rank 0 answers with metrics and weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agent_rl.batch import collate, split_groups, version_stats
from agent_rl.learners._step_metrics import skip_if_all_masked, step_metrics
from agent_rl.learners._torch_rank import RankSpec, TorchRank
from agent_rl.learners.api import TrainedRow, trained_rows
from agent_rl.learners.mismatch import mismatch_metrics
from agent_rl.types import Group
from agent_rl.weights.group import WeightGroupError
from vcpo.distill import DistillConfig
from vcpo.step import RowResults, StepConfig

if TYPE_CHECKING:
    from agent_rl.config import LearnerSpec
    from agent_rl.learners._dp import RankPool
    from agent_rl.learners._ray_ranks import RayRankPool
    from agent_rl.learners.api import Learner
    from agent_rl.placement import Role
    from agent_rl.weights.adapters import Adapter
    from agent_rl.weights.group import Endpoint, GroupSpec, TensorMeta


# vcpo.StepMetrics field -> logged name (everything the step reports is logged).
class TorchLearner:
    """See the module docstring; implements `agent_rl.learners.Learner`."""

    def __init__(
        self,
        spec: RankSpec,
        *,
        dp: int = 1,
        role: Role | None = None,
        rank_cores: tuple[tuple[int, ...], ...] | None = None,
        mismatch_threshold: float = 0.1,
        timeout_s: float = 600.0,
    ):
        """Ranks are Ray actors placed as `role` (placement.learner) when Ray is up and the ranks need it (dp>1, or
        the role asks for GPUs or a node kind), else local worker processes (dp>1), else this process.
        `rank_cores` (placement.topology: processes): every rank, dp=1 too, in a worker process pinned to its cores."""
        self.spec = spec
        self.dp = dp
        self.version = 0
        self._local: TorchRank | None = None
        self._row_uids: list[tuple[str, ...]] = []  # per rank: the uid of each row of the last step
        self._rows: list[RowResults] = []  # per rank: the last step's rows
        self.mismatch_threshold = mismatch_threshold
        self._payload_mib: float | None = None
        self._pool: RankPool | RayRankPool | None = None
        if rank_cores is not None:
            from agent_rl.learners._dp import RankPool

            self._pool = RankPool(spec, dp, cores=rank_cores)
        elif role is not None and ray_ranks(role):
            from agent_rl.learners._ray_ranks import RayRankPool

            self._pool = RayRankPool(spec, dp, role=role, timeout_s=timeout_s)
        elif dp == 1:
            self._local = TorchRank(spec, device="cuda" if torch.cuda.is_available() else "cpu")
        else:
            from agent_rl.learners._dp import RankPool

            self._pool = RankPool(spec, dp)

    def _call(self, method: str, args: Sequence[tuple[object, ...]]) -> list[object]:
        if self._local is not None:
            return [getattr(self._local, method)(*args[0])]
        assert self._pool is not None
        return self._pool.call(method, args)

    def step(self, groups: Sequence[Group]) -> Mapping[str, float]:
        """One optimizer update on whole groups; version + 1.

        A batch with no loss token at all (every trajectory masked, e.g. all void turns) is
        not an update: weights, optimizer, schedule and version stay, and `learner/skipped` is 1.
        """
        t0 = time.perf_counter()
        batches = [collate(s, sort_by_length=True) for s in split_groups(groups, self.dp)]
        shards = [b.policy for b in batches]
        self._row_uids, self._rows = [], []  # a skipped step reports no rows
        for b in shards:
            b.validate()  # here, where the error is clear, not in a worker mid-collective
        metrics = version_stats(groups, self.version)
        if (skipped := skip_if_all_masked(shards, self.version)) is not None:
            return metrics | skipped
        raw = self._call("step", [(b,) for b in shards])[0]
        self._row_uids = [b.uids for b in batches]
        self._rows = self._call("last_rows", [()] * self.dp)  # type: ignore[assignment]
        assert isinstance(raw, dict)
        metrics |= step_metrics(raw, shards, time.perf_counter() - t0)
        metrics |= mismatch_metrics(
            batches, [r.logprobs for r in self._rows], self.version, self.mismatch_threshold
        )
        if self._payload_mib is None:
            self._payload_mib = self._rank0("payload_bytes") / 2**20
        metrics["weights/push_mib"] = self._payload_mib  # what one push ships (LoRA: the adapter alone)
        self.version += 1
        return metrics

    def set_lr_scale(self, scale: float) -> None:
        """Every rank's base lr becomes learner.lr x scale (monitor.on_warning: rollback lowers it)."""
        self._call("set_lr_scale", [(scale,)] * self.dp)

    def trained_rows(self) -> dict[str, TrainedRow]:
        """The last step's per-trajectory results (current log-probs, baseline, advantage) by uid."""
        out: dict[str, TrainedRow] = {}
        for uids, rows in zip(self._row_uids, self._rows, strict=True):  # empty: no step yet, or skipped
            out |= trained_rows(uids, rows)
        return out

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Rank 0's weights under HF names (ranks hold identical replicas), in the model's dtype."""
        return self._rank0("hf_state_dict")

    def adapter(self) -> Adapter | None:
        """LoRA: rank 0's adapter tensors (what a push ships); None when every weight trains."""
        return self._rank0("adapter")

    def weight_endpoint(self, toward_host: str) -> Endpoint:
        return self._rank0("weight_endpoint", toward_host)

    def join_weight_group(self, spec: GroupSpec) -> TensorMeta:
        return self._rank0("join_weight_group", spec)

    def broadcast_weights(self) -> None:
        if error := self._rank0("broadcast_weights"):
            raise WeightGroupError(f"learner rank 0: {error}")

    def _rank0(self, method: str, *args: object) -> Any:
        """Rank 0 alone (ranks hold identical replicas; no collective of the DP group inside)."""
        if self._local is not None:
            return getattr(self._local, method)(*args)
        assert self._pool is not None
        return self._pool.call_rank0(method, *args)

    def save(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self._call("save", [(str(path), self.version)] * self.dp)

    def load(self, path: Path) -> None:
        versions = self._call("load", [(str(path),)] * self.dp)
        self.version = int(versions[0])  # type: ignore[call-overload]

    def close(self) -> None:
        """Stop the worker processes (dp>1); a no-op in-process."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def ray_ranks(role: Role) -> bool:
    """Ranks go to Ray when Ray is up (placement started or joined it) and there is more than one rank, or the
    ranks ask for GPUs or a node kind; a single CPU rank stays in the driver."""
    from agent_rl.placement import ray_up

    return ray_up() and (role.count > 1 or bool(role.gpus) or role.node is not None)


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
        grad_clip=lc.grad_clip,
        micro_batch_size=lc.micro_batch_size,
        micro_batch_tokens=lc.micro_batch_tokens,
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
    )


def build_learner(spec: LearnerSpec, rank_cores: tuple[tuple[int, ...], ...] | None = None) -> Learner:
    """The torch learner (learner.backend must be 'torch'); `rank_cores`: see TorchLearner."""
    if spec.learner.backend != "torch":
        raise ValueError(f"build_learner: learner.backend is {spec.learner.backend!r}; this builds 'torch'")
    from agent_rl.placement import learner_role

    role = learner_role(spec.learner, spec.place)
    return TorchLearner(
        rank_spec(spec), dp=spec.learner.dp, role=role, rank_cores=rank_cores, timeout_s=spec.timeout_s,
        mismatch_threshold=spec.learner.mismatch_threshold,
    )  # fmt: skip
