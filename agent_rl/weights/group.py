"""The weight-update process group between learner rank 0 and the engines, as SGLang forms it.

SGLang's `/init_weights_update_group` joins a torch.distributed group that exists beside the
engine's own groups: a TCP-store rendezvous at `tcp://master_address:master_port` (the store is
hosted by rank 0, the trainer), a `PrefixStore` named after the group, and
`distributed_c10d._new_process_group_helper` with group ranks equal to global ranks. The trainer
is rank 0; engine i's tensor-parallel rank r is `rank_offset_i + r`; world size is 1 + the sum of
the engines' tp sizes. `/update_weights_from_distributed` then receives every announced tensor,
in the announced order, by `broadcast(src=0)`. Both sides here use that exact mechanism, so our
learner talks to a real SGLang server and our embedded engine to any SGLang-style trainer.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    import torch.distributed as dist

Backend = Literal["nccl", "gloo"]
DEFAULT_GROUP = "weight_update_group"  # SGLang's default group_name
JOIN_TIMEOUT = timedelta(minutes=30)  # torch's (and SGLang's) default process-group timeout


@dataclass(frozen=True)
class Endpoint:
    """Where learner rank 0 hosts the group's TCP store, and the backend its tensors need."""

    address: str
    port: int
    backend: Backend


@dataclass(frozen=True)
class GroupSpec:
    """Everything a member needs to join (rank aside): what `/init_weights_update_group` carries."""

    endpoint: Endpoint
    world_size: int
    group_name: str = DEFAULT_GROUP


@dataclass(frozen=True)
class TensorMeta:
    """Names, dtypes (torch attribute names, e.g. "bfloat16") and shapes of one broadcast, in its order."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> TensorMeta:
        return cls(
            tuple(tensors),
            tuple(dtype_name(t.dtype) for t in tensors.values()),
            tuple(tuple(t.shape) for t in tensors.values()),
        )


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16": the receiver resolves it with getattr(torch, name), as SGLang does."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype a request names; ValueError naming the value otherwise."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtypes: {name!r} is not a torch dtype name (e.g. 'bfloat16', 'float32')")
    return dtype


def free_endpoint(toward_host: str, backend: Backend) -> Endpoint:
    """An address of this machine that `toward_host` can reach (the interface that routes to it) and a free port.

    Connecting a UDP socket sends nothing; it only asks the kernel which local address routes there.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((toward_host, 9))
            address = s.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return Endpoint(address, port, backend)


def join(spec: GroupSpec, rank: int, *, timeout: timedelta = JOIN_TIMEOUT) -> dist.ProcessGroup:
    """Join the group as `rank`; blocks until all `world_size` members have joined. Rank 0 hosts the store.

    A group of its own (not the default group), so a learner rank that already belongs to its
    data-parallel group, or an engine process with none, can both join.
    """
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} outside the weight group's world of {spec.world_size}")
    ep = spec.endpoint
    store, rank, world = next(
        rendezvous(f"tcp://{ep.address}:{ep.port}", rank, spec.world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(
        world,
        rank,
        [],
        Backend(ep.backend),
        PrefixStore(spec.group_name, store),
        group_name=spec.group_name,
        timeout=timeout,
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}  # group rank == global rank: src=0 is rank 0
    return pg


def leave(group: dist.ProcessGroup) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


class WeightGroupError(RuntimeError):
    """A broadcast failed on the learner's side (a member was lost mid-send); a new group can be formed."""


def rejoin(old: tuple[dist.ProcessGroup, str] | None, spec: GroupSpec) -> tuple[dist.ProcessGroup, str]:
    """Rank 0 leaves its previous weight group (best effort: its members may be gone) and joins `spec`'s."""
    if old is not None:
        with contextlib.suppress(RuntimeError, ValueError):  # already torn down by a failed collective
            leave(old[0])
    return join(spec, 0), spec.endpoint.backend


def send_or_error(tensors: Iterable[torch.Tensor], group: dist.ProcessGroup, backend: Backend) -> str | None:
    """`send`, with a failure of the group returned as text (the learner's ranks stay up; a new group is formed)."""
    try:
        send(tensors, group, backend)
    except RuntimeError as e:  # gloo/NCCL: a peer closed the connection or timed out
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def send(tensors: Iterable[torch.Tensor], group: dist.ProcessGroup, backend: Backend) -> None:
    """Rank 0: broadcast each tensor in order (moved to the backend's device one at a time)."""
    import torch.distributed as dist

    device = _device(backend)
    for t in tensors:
        dist.broadcast(t.detach().to(device).contiguous(), src=0, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def receive(meta: TensorMeta, group: dist.ProcessGroup, backend: str) -> dict[str, torch.Tensor]:
    """Any other rank: receive the announced tensors, in order, from rank 0."""
    import torch.distributed as dist

    device = _device(backend)
    out: dict[str, torch.Tensor] = {}
    works = []
    for name, dtype, shape in zip(meta.names, meta.dtypes, meta.shapes, strict=True):
        t = torch.empty(shape, dtype=parse_dtype(dtype), device=device)
        works.append(dist.broadcast(t, src=0, group=group, async_op=True))
        out[name] = t
    for w in works:
        w.wait()
    return out
