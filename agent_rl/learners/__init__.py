"""Learners behind `api.Learner`: a rank kind (what the ranks are) in a pool (where they run), chosen here.

    kind: torch (torch_learner.py, the default) | megatron (megatron/__init__.py)     <- learner.backend
    pool: this process (_inprocess.py) | local worker processes (_processes.py) | Ray actors (_ray_ranks.py)

The two choices are independent: `facade.RankLearner` drives any kind through any pool. Heavy backends are
imported only when a kind's ranks are built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from agent_rl.config import LearnerSpec
    from agent_rl.learners._pool import Pool
    from agent_rl.learners.facade import RankLearner
    from agent_rl.learners.kind import RankKind

PoolName = Literal["auto", "inprocess", "processes", "ray"]


def build(
    spec: LearnerSpec, rank_cores: tuple[tuple[int, ...], ...] | None = None, *, pool: PoolName = "auto"
) -> RankLearner:
    """The learner `spec` describes (`Recipe.learner_spec`). `rank_cores` (placement.topology: processes): every
    rank runs in a worker process of its own, pinned to its cores. `pool` overrides where the ranks run (auto:
    see `pool_for`)."""
    from agent_rl.learners.facade import RankLearner

    kind = rank_kind(spec)
    return RankLearner(
        kind,
        make_pool(kind, spec, rank_cores, pool),
        mismatch_threshold=spec.learner.mismatch_threshold,
        skip_no_signal=spec.algorithm.skip_no_signal and spec.algorithm.teacher is None,
    )


def rank_kind(spec: LearnerSpec) -> RankKind:
    """What the ranks are: learner.backend."""
    if spec.learner.backend == "megatron":
        from agent_rl.learners.megatron import megatron_kind

        return megatron_kind(spec)
    from agent_rl.learners.torch_learner import torch_kind

    return torch_kind(spec)


def pool_for(kind: RankKind, spec: LearnerSpec, rank_cores: object | None) -> PoolName:
    """Where the ranks run when the caller does not say: worker processes pinned to `rank_cores` when the
    placement gives cores; Ray actors when Ray is up and the ranks need it (more than one rank, or GPUs or a
    node kind asked for in placement.learner); this process for a single rank; worker processes otherwise."""
    from agent_rl.placement import learner_role, ray_up

    role = learner_role(spec.learner, spec.place)
    if rank_cores is not None:
        return "processes"
    if ray_up() and (role.count > 1 or bool(role.gpus) or role.node is not None):
        return "ray"
    return "inprocess" if kind.world == 1 else "processes"


def make_pool(
    kind: RankKind, spec: LearnerSpec, rank_cores: tuple[tuple[int, ...], ...] | None, name: PoolName = "auto"
) -> Pool:
    """Start `kind`'s ranks in the pool `name` (auto: `pool_for`), on learner.device."""
    name = pool_for(kind, spec, rank_cores) if name == "auto" else name
    device = spec.learner.device
    if name == "inprocess":
        from agent_rl.learners._inprocess import InProcessPool

        return InProcessPool(kind, device)
    if name == "processes":
        from agent_rl.learners._processes import ProcessPool

        return ProcessPool(kind, device=device, cores=rank_cores)
    from agent_rl.learners._ray_ranks import RayPool
    from agent_rl.placement import learner_role

    return RayPool(kind, role=learner_role(spec.learner, spec.place), device=device, timeout_s=spec.timeout_s)
