"""Data-parallel ranks as Ray actors, for runs where Ray is up (a cluster, or several machines).

Same interface as `RankPool`: Ray decides which node (and GPU) holds each rank; rank 0's
node address is the rendezvous of the torch.distributed group (NCCL where the actor got
a GPU, gloo otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_rl.learners._dp import RankError
from agent_rl.learners._torch_rank import RankSpec


class _RayRank:
    def __init__(self, spec: RankSpec, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.spec = spec
        self.worker: Any = None

    def address(self) -> str:
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def setup(self, init_method: str, rank: int, world: int) -> None:
        from datetime import timedelta

        import ray
        import torch
        import torch.distributed as dist

        from agent_rl.learners._torch_rank import TorchRank

        gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        dist.init_process_group(
            "nccl" if gpu else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=timedelta(minutes=30),
        )
        self.worker = TorchRank(self.spec, dp_group=dist.group.WORLD, device="cuda:0" if gpu else "cpu")

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)


class RayRankPool:
    """`world` Ray actors, each one rank, with `cpus`/`gpus` resources apiece."""

    def __init__(self, spec: RankSpec, world: int, *, cpus: float = 1.0, gpus: float = 0.0):
        import ray

        actor = ray.remote(num_cpus=cpus, num_gpus=gpus)(_RayRank)
        self._actors = [actor.remote(spec, max(1, int(cpus))) for _ in range(world)]
        init_method = self._get([self._actors[0].address.remote()])[0]
        self._get([a.setup.remote(init_method, r, world) for r, a in enumerate(self._actors)])

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        return self._get([a.call.remote(method, *arg) for a, arg in zip(self._actors, args, strict=True)])

    def call_rank0(self, method: str, *args: Any) -> Any:
        return self._get([self._actors[0].call.remote(method, *args)])[0]

    def _get(self, refs: list[Any]) -> list[Any]:
        """Results in order; the first failure kills every rank (the others may wait in a collective)."""
        import ray

        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready)
            except ray.exceptions.RayError as e:
                self.close()
                raise RankError(f"learner rank {refs.index(ready[0])}: {e}") from None
        return ray.get(refs)

    def close(self) -> None:
        import ray

        for a in self._actors:
            ray.kill(a)
        self._actors = []
