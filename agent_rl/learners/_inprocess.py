"""The pool of one rank that runs in this process (dp = tp = cp = 1 on one machine, no pinned cores)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_rl.learners._pool import Device, rank_device

if TYPE_CHECKING:
    from agent_rl.learners.kind import RankKind


class InProcessPool:
    """Builds the single rank here; calls are plain method calls. `rank` is the rank object itself."""

    def __init__(self, kind: RankKind, device: Device = "auto"):
        if kind.world != 1:
            raise ValueError(
                f"the in-process pool runs one rank; this learner has {kind.world} (dp x tp x cp)"
            )
        self.rank: Any = kind.build(kind.spec, 0, 1, None, rank_device(device, 0, 1))

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        (a,) = args
        return [getattr(self.rank, method)(*a)]

    def call_rank0(self, method: str, *args: Any) -> Any:
        return getattr(self.rank, method)(*args)

    def close(self) -> None:
        """Nothing to stop: the rank goes with this object."""
