"""`rollout.fixed_lag: k` (research switch): the engines always sample with the weights of k versions ago.

With admission lag 0 (the buffer admits one batch at a time), batch b is sampled entirely by version
max(0, b - k) on any hardware: deterministic lag injection for staleness studies. The publisher keeps
the last k + 1 versions' weights (copies in the driver, so not with the nccl broadcast, which config
refuses) and its history is part of every checkpoint.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from agent_rl.weight_sync.publish import Publisher

if TYPE_CHECKING:
    import torch


class LaggedPublisher(Publisher):
    def __init__(self, *args: Any, lag: int, **kw: Any):
        super().__init__(*args, **kw)
        self.lag = lag
        self.history: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=lag + 1)

    def choose(self, version: int, tensors: dict[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
        if not self.history or self.history[-1][0] != version:  # a resumed run re-pushes its last version
            self.history.append((version, {k: v.detach().clone() for k, v in tensors.items()}))
        target = max(0, version - self.lag)
        return next((v, t) for v, t in self.history if v >= target)

    def state(self) -> list[tuple[int, dict[str, torch.Tensor]]]:
        return list(self.history)

    def load_state(self, state: Any, *, shift: int = 0) -> None:
        self.history.clear()
        self.history.extend((v + shift, w) for v, w in state or ())
