"""The Megatron learner facade: the same contract as the torch learner, ranks in worker processes.

world = dp * tp * cp ranks. One rank runs in this process; more run in spawned workers
(gloo on CPU, NCCL on GPU) served over pipes by the torch learner's `RankPool`. Every call
goes to all ranks (the TP gather for weights is a collective); global rank 0 answers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agent_rl.batch import collate, split_groups, version_stats
from agent_rl.learners._dp import RankPool, _free_port, join_rank_group
from agent_rl.learners._step_metrics import skip_if_all_masked, step_metrics
from agent_rl.learners.api import TrainedRow, trained_rows
from agent_rl.learners.megatron.rank import MegatronRank, MegatronSpec
from agent_rl.learners.mismatch import mismatch_metrics
from agent_rl.types import Group
from agent_rl.weights.group import Endpoint, GroupSpec, TensorMeta


def build_megatron_rank(spec: MegatronSpec, rank: int, world: int, port: int) -> MegatronRank:
    """RankPool builder: join the process group, then build this rank's MegatronRank."""
    join_rank_group(rank, world, port)
    return MegatronRank(spec)


class MegatronLearner:
    """Implements `agent_rl.learners.Learner` with megatron-core TP / SP / CP and DP over whole groups."""

    def __init__(
        self,
        spec: MegatronSpec,
        *,
        in_process: bool | None = None,
        rank_cores: tuple[tuple[int, ...], ...] | None = None,
        mismatch_threshold: float = 0.1,
    ):
        """`in_process` (default: world == 1 and no `rank_cores`) runs the single rank here; False always uses
        worker processes, which keeps megatron's global state and process group out of the caller's process.
        `rank_cores` (placement.topology: processes): each rank's process is pinned to its cores."""
        self.spec = spec
        self.version = 0
        self._row_uids: list[tuple[str, ...]] = []  # per DP rank: the uid of each row of the last step
        self._rows: list[Any] = []  # per DP rank: the last step's RowResults
        self.mismatch_threshold = mismatch_threshold
        self._local: MegatronRank | None = None
        self._pool: RankPool | None = None
        if in_process is None:
            in_process = spec.world == 1 and rank_cores is None
        if in_process and spec.world != 1:
            raise ValueError(f"in_process=True needs world size 1, got dp*tp*cp = {spec.world}")
        if in_process:
            import torch.distributed as dist

            if not dist.is_initialized():
                join_rank_group(0, 1, _free_port())
            self._local = MegatronRank(spec)
        else:
            self._pool = RankPool(spec, spec.world, build=build_megatron_rank, cores=rank_cores)

    def _all(self, method: str, *args: Any) -> Any:
        """Call `method(*args)` on every rank; global rank 0's answer."""
        if self._local is not None:
            return getattr(self._local, method)(*args)
        assert self._pool is not None
        return self._pool.call(method, [args] * self.spec.world)[0]

    def step(self, groups: Sequence[Group]) -> Mapping[str, float]:
        t0 = time.perf_counter()
        batches = [collate(s) for s in split_groups(groups, self.spec.dp)]
        shares = [b.policy for b in batches]
        for b in shares:
            b.validate()
        self._row_uids, self._rows = [], []  # a skipped step reports no rows
        metrics = version_stats(groups, self.version)
        if (skipped := skip_if_all_masked(shares, self.version)) is not None:
            return metrics | skipped
        metrics |= step_metrics(self._all("step", shares), shares, time.perf_counter() - t0)
        self._row_uids = [b.uids for b in batches]
        if self._local is not None:
            answers = [self._local.last_rows()]
        else:
            assert self._pool is not None
            answers = self._pool.call("last_rows", [()] * self.spec.world)
        by_dp = {dp: rows for dp, rows in reversed(answers) if rows is not None}
        self._rows = [by_dp[dp] for dp in range(len(batches))]
        metrics |= mismatch_metrics(
            batches, [r.logprobs for r in self._rows], self.version, self.mismatch_threshold
        )
        self.version += 1
        return metrics

    def trained_rows(self) -> dict[str, TrainedRow]:
        """The last step's per-trajectory results by uid, from one rank of each data-parallel replica."""
        out: dict[str, TrainedRow] = {}
        for uids, rows in zip(self._row_uids, self._rows, strict=True):  # empty: no step yet, or skipped
            out |= trained_rows(uids, rows)
        return out

    def adapter(self) -> None:
        """Never LoRA: the config refuses learner.lora with this backend."""
        return None

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return self._all("hf_state_dict")

    def weight_endpoint(self, toward_host: str) -> Endpoint:
        if self._local is not None:
            return self._local.weight_endpoint(toward_host)
        assert self._pool is not None
        return self._pool.call_rank0("weight_endpoint", toward_host)

    def join_weight_group(self, spec: GroupSpec) -> TensorMeta:
        return self._all("join_weight_group", spec)

    def broadcast_weights(self) -> None:
        self._all("broadcast_weights")

    def save(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self._all("save", str(path), self.version)

    def load(self, path: Path) -> None:
        self.version = int(self._all("load", str(path)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
