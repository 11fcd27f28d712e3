"""What every pool of learner ranks shares: the `Pool` protocol, its errors, how a rank joins the ranks'
process group and which device it computes on.

A pool places `kind.world` ranks (in this process, in local worker processes, or in Ray actors) and calls a
method on all of them or on rank 0 alone; it never looks at what the ranks compute (the facade and the rank
kind do).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Literal, Protocol

from agent_rl.errors import UserError

Device = Literal["auto", "cpu", "cuda"]

RankBuilder = Callable[[Any, int, int, "str | None", str], Any]
"""(spec, rank, world, init_method, device) -> the rank object whose methods the pool calls. Module-level (a
pool pickles it). init_method is tcp://host:port of rank 0's node, or None for the single rank of this process
(it joins a process group only if its kind needs one); device is "cpu", "cuda" or "cuda:N"."""


class RankError(RuntimeError):
    """A learner rank failed; the message carries the rank's traceback."""


class RankLost(RankError, UserError):
    """A learner rank's process (or its node) died: not a bug of the run, one line for the user."""


LOST_HINT = (
    "; continue from the last checkpoint with --resume RUN_DIR once there is room for the learner again"
)


class Pool(Protocol):
    """Where the ranks run and how the facade reaches them."""

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`method(*args[r])` on every rank r, concurrently (collectives inside are fine); answers in rank order."""
        ...

    def call_rank0(self, method: str, *args: Any) -> Any:
        """`method(*args)` on rank 0 alone (no collective inside, or the other ranks would hang)."""
        ...

    def close(self) -> None:
        """Stop the ranks this pool started."""
        ...


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rank_device(choice: Device, local_rank: int, local_world: int) -> str:
    """The device of rank `local_rank` of `local_world` ranks on this machine for `learner.device`: auto takes
    GPU `local_rank` when every rank here can have one (else the CPU), cuda insists on it, cpu never uses one."""
    import torch

    if choice == "cpu":
        return "cpu"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= local_world:
        return f"cuda:{local_rank}"
    if choice == "cuda":
        raise UserError(
            f"learner.device: cuda needs one GPU per learner rank on this machine ({local_world}); "
            f"torch sees {gpus}: lower learner.dp (x tp x cp), or set learner.device: auto or cpu"
        )
    return "cpu"


def join_rank_group(rank: int, world: int, init_method: str, device: str | None = None) -> str:
    """Join the learner's default process group at `init_method` (tcp://rank-0-host:port): NCCL when this rank
    computes on a GPU, else gloo. `device` None: `rank_device("auto", rank, world)`. Returns the device."""
    import torch
    import torch.distributed as dist

    if device is None:
        device = rank_device("auto", rank, world)
    if device.startswith("cuda"):
        # "cuda" alone (a one-rank group built in this process): the current GPU
        index = torch.device(device).index
        device = f"cuda:{torch.cuda.current_device() if index is None else index}"
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        "nccl" if device.startswith("cuda") else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=30),
    )
    return device
