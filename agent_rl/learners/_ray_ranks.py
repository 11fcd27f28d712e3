"""Learner ranks as Ray actors, for runs where Ray is up (a cluster, or GPUs to share out).

Any rank kind (`kind.build`). Every rank sits in a placement-group bundle of the `learner` role (its CPUs,
GPUs and node kind): ranks that need no shared node (`role.group` 1, the torch learner's) in one PACK group;
otherwise one STRICT_PACK group per `role.group` consecutive ranks (Megatron's tp*cp), so tensor-parallel
traffic stays on a node's links and replicas may sit on different nodes. The process group meets at rank 0's
node address (`ray_room.node_ip`), never at 127.0.0.1; NCCL where the actor got a GPU, gloo otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_rl.errors import UserError
from agent_rl.learners._pool import LOST_HINT, Device, RankBuilder, RankError, RankLost
from agent_rl.ray_room import record

if TYPE_CHECKING:
    from agent_rl.learners.kind import RankKind
    from agent_rl.placement import Role


class _RayRank:
    def __init__(self, build: RankBuilder, spec: Any, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.build, self.spec = build, spec
        self.worker: Any = None

    def address(self) -> str:
        """tcp://this node's address:a free port, for the process group's rendezvous (rank 0 hosts it)."""
        from agent_rl.learners._pool import free_port
        from agent_rl.ray_room import node_ip

        host = node_ip()
        return f"tcp://{host}:{free_port(host)}"

    def setup(self, init_method: str, rank: int, world: int, device: Device) -> str:
        import ray
        import torch

        gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()  # Ray set CUDA_VISIBLE_DEVICES to its GPU
        if device == "cuda" and not gpu:
            raise UserError(
                f"learner.device: cuda, but learner rank {rank}'s Ray actor has no GPU: set placement.learner.gpus"
            )
        self.worker = self.build(
            self.spec, rank, world, init_method, "cuda:0" if gpu and device != "cpu" else "cpu"
        )
        return ray.get_runtime_context().get_node_id()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)


class RayPool:
    """`kind.world` Ray actors, one rank each, placed as the `learner` role says; `role.group` consecutive ranks
    share a node."""

    def __init__(self, kind: RankKind, *, role: Role, device: Device = "auto", timeout_s: float = 600.0):
        import ray

        from agent_rl.ray_room import actor_options, reserve

        world, group = kind.world, role.group
        self._actors: list[Any] = []
        if group > 1:  # one node per model-parallel group
            self._pgs = [
                reserve(role, group, strategy="STRICT_PACK", timeout_s=timeout_s)
                for _ in range(world // group)
            ]
            slots = [(self._pgs[r // group], r % group) for r in range(world)]
        else:
            self._pgs = [reserve(role, world, strategy="PACK", timeout_s=timeout_s)]
            slots = [(self._pgs[0], r) for r in range(world)]
        actor = ray.remote(_RayRank)
        threads = max(1, int(role.cpus))
        self._actors = [
            actor.options(**actor_options(role, pg, i)).remote(kind.build, kind.spec, threads)
            for pg, i in slots
        ]
        init_method = self._get([self._actors[0].address.remote()])[0]
        self.nodes: list[str] = self._get(
            [a.setup.remote(init_method, r, world, device) for r, a in enumerate(self._actors)]
        )
        for rank, node in enumerate(self.nodes):
            record("learner", rank, node)

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
                raise _error(refs.index(ready[0]), e) from None
        return ray.get(refs)

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self._actors:
            ray.kill(a)
        for pg in getattr(self, "_pgs", []):
            remove_placement_group(pg)
        self._actors, self._pgs = [], []


def _error(rank: int, e: Exception) -> RankError:
    """A lost rank (its node or process died) is one line for the user; a rank's own exception keeps its trace."""
    import ray

    # ObjectLostError: the rank's result lived on a node that died before it was fetched (a node killed while
    # rank 0 returns its weights for a checkpoint: an ObjectReconstructionFailedError, the task has no retries).
    lost = (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError, ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError)  # fmt: skip
    if isinstance(e, lost):
        return RankLost(
            f"learner rank {rank} is gone (its node or process died: {type(e).__name__}){LOST_HINT}"
        )
    # A rank still alive in a collective when a peer's node died: gloo or NCCL raise the lost connection as
    # this rank's own error, which can reach us before Ray reports the dead rank.
    if isinstance(e, ray.exceptions.RayTaskError):
        text = f"{e} {e.cause}"
        backend = next((b for b in ("gloo", "NCCL") if b in text), None)
        peer = next((m for m in PEER_LOST if m in text), None)
        if backend and peer:
            return RankLost(
                f"a peer of learner rank {rank} is gone (its {backend} collective: {peer}; another rank's node "
                f"or process died){LOST_HINT}"
            )
    return RankError(f"learner rank {rank}: {e}")


# How gloo (its TCP transport) and NCCL word a peer that went away mid-collective.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "remote process exited")
