"""The Megatron learner: megatron-core GPTModel with tensor, sequence and context parallelism.

Chosen by `learner.backend: megatron` in a recipe. megatron-core is an optional extra and
is imported only when this backend is built; without it, `build_megatron_learner` says
what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_rl.config import LearnerSpec
    from agent_rl.learners.api import Learner

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


def build_megatron_learner(
    spec: LearnerSpec,
    *,
    in_process: bool | None = None,
    rank_cores: tuple[tuple[int, ...], ...] | None = None,
) -> Learner:
    """The Megatron learner (learner.backend must be 'megatron'); see MegatronLearner for in_process."""
    if spec.learner.backend != "megatron":
        raise ValueError(
            f"build_megatron_learner: learner.backend is {spec.learner.backend!r}; this builds 'megatron'"
        )
    require_megatron()
    from agent_rl.learners.megatron.learner import MegatronLearner
    from agent_rl.learners.megatron.model import ParallelConfig
    from agent_rl.learners.megatron.rank import MegatronSpec
    from agent_rl.learners.torch_learner import rank_spec

    lc = spec.learner
    mspec = MegatronSpec(
        rank=rank_spec(spec),
        par=ParallelConfig(tp=lc.tp, sp=lc.sp, cp=lc.cp),
        dp=lc.dp,
        temperature=spec.temperature,
        pack=lc.pack_sequences is not False,
    )
    return MegatronLearner(
        mspec, in_process=in_process, rank_cores=rank_cores, mismatch_threshold=lc.mismatch_threshold
    )
