"""The learner the loop talks to: any rank kind (kind.py) in any pool (this process, worker processes, Ray).

Each step the facade splits the global batch into whole groups per data-parallel share, the ranks step in
lockstep (gradients summed once per step inside vcpo), and rank 0 answers with metrics and weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_rl.batch import collate, split_groups, version_stats
from agent_rl.learners._inprocess import InProcessPool
from agent_rl.learners._step_metrics import skip_if_all_masked, skip_if_no_signal, step_metrics
from agent_rl.learners.api import TrainedRow, trained_rows
from agent_rl.learners.mismatch import mismatch_metrics
from agent_rl.learners.routing_replay import route_batch, routing_metrics
from agent_rl.weights.group import WeightGroupError

if TYPE_CHECKING:
    import torch

    from agent_rl.learners._pool import Pool
    from agent_rl.learners.kind import RankKind
    from agent_rl.types import Group
    from agent_rl.weights.adapters import Adapter
    from agent_rl.weights.group import Endpoint, GroupSpec, TensorMeta
    from vcpo.step import RowResults


class RankLearner:
    """Implements `agent_rl.learners.api.Learner` for `kind`'s ranks placed by `pool`."""

    def __init__(
        self, kind: RankKind, pool: Pool, *, mismatch_threshold: float = 0.1, skip_no_signal: bool = False
    ):
        self.kind, self.pool = kind, pool
        self.skip_no_signal = skip_no_signal  # algorithm.skip_no_signal; off with a teacher
        self.version = 0
        self.mismatch_threshold = mismatch_threshold
        self._row_uids: list[tuple[str, ...]] = []  # per share: the uid of each row of the last step
        self._rows: list[RowResults] = []  # per share: the last step's rows
        self._payload_mib: float | None = None

    @property
    def local(self) -> Any:
        """The rank object when the single rank runs in this process (tests, benchmarks); else None."""
        return self.pool.rank if isinstance(self.pool, InProcessPool) else None

    def step(self, groups: Sequence[Group]) -> Mapping[str, float]:
        """One optimizer update on whole groups; version + 1.

        A batch with no loss token at all (every trajectory masked, e.g. all void turns) is
        not an update: weights, optimizer, schedule and version stay, and `learner/skipped` is 1. So is a batch
        without a reward signal (every group's rewards equal) when `skip_no_signal`: `learner/no_signal` is 1 too.
        """
        t0 = time.perf_counter()
        kind = self.kind
        batches = [collate(s, sort_by_length=kind.sort_rows) for s in split_groups(groups, kind.dp)]
        shares = [b.policy for b in batches]
        self._row_uids, self._rows = [], []  # a skipped step reports no rows
        for b in shares:
            b.validate()  # here, where the error is clear, not in a worker mid-collective
        metrics = version_stats(groups, self.version)
        if (skipped := skip_if_all_masked(shares, self.version)) is not None:
            return metrics | skipped
        if self.skip_no_signal and (skipped := skip_if_no_signal(groups, self.version)) is not None:
            return metrics | skipped
        args = kind.step_args(shares, kind.world)
        if (
            kind.routes
        ):  # the rollout's routed experts of an MoE model, replayed and measured (routing_replay.py)
            args = [(*a, route_batch(b.routed_experts, b.policy.loss_mask, b.versions, self.version))
                    for a, b in zip(args, batches, strict=True)]  # fmt: skip
        raws = self.pool.call("step", args)
        raw = {k: v for k, v in raws[0].items() if not k.startswith("routing/")}
        self._row_uids = [b.uids for b in batches]
        self._rows = kind.rows(self.pool.call("last_rows", [()] * kind.world))
        metrics |= step_metrics(raw, shares, time.perf_counter() - t0)
        metrics |= mismatch_metrics(
            batches, [r.logprobs for r in self._rows], self.version, self.mismatch_threshold
        )
        metrics |= routing_metrics(raws)
        if kind.reports_payload:
            if self._payload_mib is None:
                self._payload_mib = self.pool.call_rank0("payload_bytes") / 2**20
            metrics["weights/push_mib"] = self._payload_mib  # what one push ships (LoRA: the adapter alone)
        self.version += 1
        return metrics

    def set_lr_scale(self, scale: float) -> None:
        """Every rank's base lr becomes learner.lr x scale (monitor.on_warning: rollback lowers it)."""
        self._all("set_lr_scale", scale)

    def trained_rows(self) -> dict[str, TrainedRow]:
        """The last step's per-trajectory results (current log-probs, baseline, advantage) by uid."""
        out: dict[str, TrainedRow] = {}
        for uids, rows in zip(self._row_uids, self._rows, strict=True):  # empty: no step yet, or skipped
            out |= trained_rows(uids, rows)
        return out

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights under HF names in the engines' dtype (rank 0's; gathered where ranks hold shards)."""
        return self._weights("hf_state_dict")

    def adapter(self) -> Adapter | None:
        """LoRA: rank 0's adapter tensors (what a push ships); None when every weight trains."""
        return self.pool.call_rank0("adapter") if self.kind.lora else None

    def weight_endpoint(self, toward_host: str) -> Endpoint:
        return self.pool.call_rank0("weight_endpoint", toward_host)

    def join_weight_group(self, spec: GroupSpec) -> TensorMeta:
        return self._weights("join_weight_group", spec)

    def broadcast_weights(self) -> None:
        if error := self._weights("broadcast_weights"):
            raise WeightGroupError(f"learner rank 0: {error}")

    def save(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self._all("save", str(path), self.version)

    def load(self, path: Path) -> None:
        self.version = int(self._all("load", str(path)))

    def close(self) -> None:
        """Stop the ranks' processes or actors (nothing to stop in-process)."""
        self.pool.close()

    def _all(self, method: str, *args: Any) -> Any:
        """`method(*args)` on every rank; rank 0's answer."""
        return self.pool.call(method, [args] * self.kind.world)[0]

    def _weights(self, method: str, *args: Any) -> Any:
        """Rank 0's answer; every rank takes part where reading the weights is a collective (TP gather)."""
        if self.kind.weights_are_collective:
            return self._all(method, *args)
        return self.pool.call_rank0(method, *args)
