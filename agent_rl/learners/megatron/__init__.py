"""The Megatron rank kind: megatron-core GPTModel with tensor, sequence and context parallelism.

Chosen by `learner.backend: megatron` in a recipe; `megatron_kind` says how to build its ranks
(`rank.MegatronRank`) and talk to them, the pool (learners/__init__.py) where they run. megatron-core is an
optional extra, imported only when a rank is built; without it, `require_megatron` says what to install.
world = dp x tp x cp ranks; reading the weights gathers tensor-parallel shards, so every rank takes part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_rl.config import LearnerSpec
    from agent_rl.learners.kind import RankKind
    from agent_rl.learners.megatron.rank import MegatronRank, MegatronSpec
    from vcpo.batch import PolicyBatch
    from vcpo.step import RowResults

INSTALL_HINT = "pip install 'agent-rl[gpu]' (or: pip install megatron-core)"


class MegatronNotInstalled(ImportError):
    """learner.backend is megatron but megatron-core cannot be imported."""


def require_megatron() -> None:
    """Raise MegatronNotInstalled naming the extra when megatron-core is missing."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        raise MegatronNotInstalled(
            f"learner.backend: megatron needs megatron-core, which is not installed ({e}). Install it with: {INSTALL_HINT}"
        ) from e


def megatron_spec(spec: LearnerSpec) -> Any:
    """What every Megatron rank is built from: the torch learner's rank spec, the layout, activation recompute."""
    from agent_rl.learners.megatron.model import ParallelConfig, Recompute
    from agent_rl.learners.megatron.rank import MegatronSpec
    from agent_rl.learners.torch_learner import rank_spec

    lc = spec.learner
    return MegatronSpec(
        rank=rank_spec(spec),
        par=ParallelConfig(tp=lc.tp, sp=lc.sp, cp=lc.cp),
        dp=lc.dp,
        temperature=spec.temperature,
        pack=lc.pack_sequences is not False,
        recompute=Recompute.of(lc),
    )


def build_megatron_rank(
    spec: MegatronSpec, rank: int, world: int, init_method: str | None, device: str
) -> MegatronRank:
    """A `RankBuilder`: join the process group (a one-rank group of its own for the single rank of this
    process, unless one is up), then build this rank's MegatronRank."""
    import torch.distributed as dist

    from agent_rl.learners._pool import free_port, join_rank_group
    from agent_rl.learners.megatron.rank import MegatronRank

    if init_method is not None:
        join_rank_group(rank, world, init_method, device)
    elif not dist.is_initialized():
        join_rank_group(0, 1, f"tcp://127.0.0.1:{free_port()}", device)
    return MegatronRank(spec, device)


def _every_share_to_every_rank(shares: Sequence[PolicyBatch], world: int) -> list[tuple[Any, ...]]:
    return [(list(shares),)] * world  # each rank takes its data-parallel replica's share


def _rows_by_replica(answers: list[Any]) -> list[RowResults]:
    """Every rank answers (dp rank, rows); the tp/cp ranks of a replica hold the same rows."""
    by_dp = {dp: rows for dp, rows in reversed(answers) if rows is not None}
    return [by_dp[dp] for dp in range(len(by_dp))]


def megatron_kind(spec: LearnerSpec) -> RankKind:
    """The Megatron learner's ranks for `spec` (learner.backend must be 'megatron'; megatron-core installed)."""
    from agent_rl.learners.kind import RankKind

    if spec.learner.backend != "megatron":
        raise ValueError(
            f"megatron_kind: learner.backend is {spec.learner.backend!r}; this builds 'megatron'"
        )
    require_megatron()
    ms = megatron_spec(spec)
    return RankKind(
        name="megatron", spec=ms, build=build_megatron_rank, world=ms.world, dp=ms.dp,
        step_args=_every_share_to_every_rank, rows=_rows_by_replica, sort_rows=False,
        weights_are_collective=True, reports_payload=False,
        routes=ms.par.tp * ms.par.cp == 1,  # rank r is DP rank r: it takes share r's routing (MoE: moe.py)
    )  # fmt: skip
