"""What every learner offers the loop: the `Learner` protocol and `TrainedRow` (what it computed per trajectory)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from agent_rl.types import Group
    from agent_rl.weights.adapters import Adapter
    from agent_rl.weights.group import Endpoint, GroupSpec, TensorMeta
    from vcpo.step import RowResults


@dataclass(frozen=True)
class TrainedRow:
    """What the learner computed for one trajectory in its last step."""

    seq_log_weight: float  # s = Σ_t (log π − log μ) over the loss tokens; the weight is exp(s)
    advantage: float
    baseline: float
    logprobs: torch.Tensor  # [T] current log π per flattened position (prompt included; padding after)


def trained_rows(uids: Sequence[str], rows: RowResults) -> dict[str, TrainedRow]:
    """One rank's RowResults (rows in batch order) keyed by trajectory uid."""
    return {
        uid: TrainedRow(
            float(rows.seq_log_weight[i]), float(rows.advantage[i]), float(rows.baseline[i]), rows.logprobs[i]
        )
        for i, uid in enumerate(uids)
    }


class Learner(Protocol):
    """What the training loop needs from a learner, whatever runs it (torch DDP, Megatron TP/SP/CP)."""

    version: int
    """Policy version of the current weights; +1 after every optimizer step."""

    def step(self, groups: Sequence[Group]) -> Mapping[str, float]:
        """One optimizer update on whole groups (the global batch); returns finite metrics."""
        ...

    def trained_rows(self) -> dict[str, TrainedRow] | None:
        """The last step's current log-probs, baseline, advantage and weight per trajectory uid (for the
        trajectory log); None when this backend does not report them."""
        ...

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (gathered) weights under Hugging Face names, for engine weight sync and saving."""
        ...

    def adapter(self) -> Adapter | None:
        """LoRA: the current adapter tensors, which a weight push ships instead of `hf_state_dict`; else None."""
        ...

    def weight_endpoint(self, toward_host: str) -> Endpoint:
        """Address (of the interface routing to `toward_host`), free port and backend (nccl with a GPU, else
        gloo) at which learner rank 0 can host the engines' weight group."""
        ...

    def join_weight_group(self, spec: GroupSpec) -> TensorMeta:
        """Rank 0 joins the weight group as its rank 0; blocks until every engine rank has joined. Returns
        the names (HF), dtypes (the engines' dtype) and shapes every `broadcast_weights` sends, in order."""
        ...

    def broadcast_weights(self) -> None:
        """Broadcast the current weights from rank 0 in `join_weight_group`'s order; returns once sent.
        The engines receive concurrently (`/update_weights_from_distributed` with the same names)."""
        ...

    def save(self, path: Path) -> None:
        """Model, optimizer, lr schedule, RNG, version: everything needed to resume."""
        ...

    def load(self, path: Path) -> None: ...

    def close(self) -> None:
        """Stop rank processes / actors this learner started."""
        ...
