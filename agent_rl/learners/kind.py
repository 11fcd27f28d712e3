"""A rank kind: what a learner's ranks are (torch, Megatron), independent of where they run (the pool).

The facade (`facade.RankLearner`) drives any kind through any pool: it sends the kind's per-rank step
arguments, reads the kind's per-trajectory rows back, and asks rank 0 (or, where reading the weights is a
collective, every rank) for weights. A new rank kind is one file that returns a `RankKind`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_rl.learners._pool import RankBuilder
    from vcpo.batch import PolicyBatch
    from vcpo.step import RowResults


@dataclass(frozen=True)
class RankKind:
    """How to build one kind of rank and talk to it."""

    name: str  # "torch" | "megatron": learner.backend
    spec: Any  # picklable: what every rank is built from
    build: RankBuilder  # module-level (spec, rank, world, init_method | None, device) -> rank
    world: int  # ranks in all (dp x model-parallel size)
    dp: int  # data-parallel replicas: the global batch is split into this many shares of whole groups
    step_args: Callable[[Sequence[PolicyBatch], int], list[tuple[Any, ...]]]
    """(the dp shares, world) -> each rank's arguments to `step`."""
    rows: Callable[[list[Any]], list[RowResults]]
    """every rank's `last_rows()` answer -> one RowResults per dp share, in share order."""
    sort_rows: bool = True  # collate each share longest-first (neighbouring rows share a micro-batch)
    weights_are_collective: bool = False  # reading the weights gathers shards: every rank takes part
    lora: bool = False  # ranks train adapters (`adapter()` answers; pushes ship the adapter alone)
    reports_payload: bool = True  # ranks answer `payload_bytes()` (bytes one weight push ships)
    routes: bool = False  # each rank's `step` also takes its share's rollout routing (MoE: routing_replay.py)


def one_share_each(shares: Sequence[PolicyBatch], world: int) -> list[tuple[Any, ...]]:
    """Rank r steps on share r (data parallel only: world == dp)."""
    return [(s,) for s in shares]
