"""Learner ranks as local worker processes (spawned), one rank each, stepping in lockstep.

Each worker builds its rank (which joins the ranks' torch.distributed group: gloo on CPU, NCCL on GPU) and
then serves calls from the facade over a pipe: the facade sends every rank its own argument, waits for every
answer, and re-raises the first rank's error with its traceback.

Calls go to the ranks by copy (plain pickle), answers come back as torch's shared-memory handles (weights are
large). A tensor sent as a handle is fetched by the receiver from the sender's resource sharer; when one rank
fails the others are killed, and a rank killed while fetching its step's batch made the sharer print a
ConnectionResetError traceback in the trainer. A step's arguments are the batch's rows, small beside the step.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import pickle
import sys
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import torch

from agent_rl.learners._pool import (
    LOST_HINT,
    Device,
    RankBuilder,
    RankError,
    RankLost,
    free_port,
    rank_device,
)

if TYPE_CHECKING:
    from agent_rl.learners.kind import RankKind

START_METHOD = "spawn"
"""How the ranks' processes start: a fresh interpreter each (the trainer's threads, CUDA state and open files
stay behind). The test suite's Megatron modules set "forkserver" with the rank modules preloaded
(tests/conftest.py `ranks_from_a_fork_server`), so that their dozens of launches do not each import
megatron-core anew; the ranks' code and arguments travel by pickle either way."""


def _serve(
    build: RankBuilder,
    spec: Any,
    rank: int,
    world: int,
    init_method: str,
    device: str,
    conn: Connection,
    threads: int,
    cores: tuple[int, ...] | None = None,
) -> None:
    """Worker main: pin (if given cores), build the rank, then answer (method, args) calls until 'close'."""
    import torch.distributed as dist

    if cores:
        from agent_rl.cores import pin

        pin(cores)
    else:
        torch.set_num_threads(threads)
    try:
        worker = build(spec, rank, world, init_method, device)
        conn.send(("ok", None))
    except Exception:
        conn.send(("err", traceback.format_exc()))
        return
    while True:
        method, arg = pickle.loads(conn.recv_bytes())  # by copy: see the module docstring
        if method == "close":
            break
        try:
            conn.send(("ok", getattr(worker, method)(*arg)))
        except Exception:
            conn.send(("err", traceback.format_exc()))
    dist.barrier()  # no rank may tear the group down while a peer still has gloo work in flight
    dist.destroy_process_group()
    # Skip interpreter teardown: a TCPStore/gloo thread still joinable during C++ static destruction
    # aborts the process ("terminate called without an active exception"); everything is sent.
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips multiprocessing's finalizers: named semaphores this process made (tqdm's lock, for the
    # model-loading bar) would stay registered, and the resource tracker warns of them as leaked at exit.
    multiprocessing.util._run_finalizers(0)
    os._exit(0)


class ProcessPool:
    """`kind.world` spawned processes, each running one rank; `call` runs a method on all of them.

    `cores`: one tuple of core ids per rank (placement.topology: processes); each rank pins itself to them.
    `device` (learner.device): each rank's device is chosen here, as `rank_device` says for this machine."""

    def __init__(
        self, kind: RankKind, *, device: Device = "auto", cores: Sequence[tuple[int, ...]] | None = None
    ):
        ctx = torch.multiprocessing.get_context(START_METHOD)
        world = kind.world
        init_method = f"tcp://127.0.0.1:{free_port()}"  # every rank on this machine
        threads = max(1, (os.cpu_count() or 1) // world)
        devices = [rank_device(device, rank, world) for rank in range(world)]
        self._conns: list[Connection] = []
        self._procs = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(
                    kind.build,
                    kind.spec,
                    rank,
                    world,
                    init_method,
                    devices[rank],
                    child,
                    threads,
                    cores[rank] if cores else None,
                ),
                daemon=True,
            )
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect()

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run `method(*args[r])` on rank r, all ranks concurrently; results in rank order."""
        for conn, a in zip(self._conns, args, strict=True):
            _send(conn, (method, a))
        return self._collect()

    def call_rank0(self, method: str, *args: Any) -> Any:
        """Run `method` on rank 0 only (no collectives inside, or the other ranks would hang)."""
        _send(self._conns[0], (method, args))
        try:
            status, value = self._conns[0].recv()
        except EOFError:
            self._fail(
                f"learner rank 0: process exited with code {self._procs[0].exitcode}{LOST_HINT}", RankLost
            )
        if status != "ok":
            self._fail(f"learner rank 0: {value}")
        return value

    def _collect(self) -> list[Any]:
        """Every rank's answer; the first failure (error or death) stops all ranks and is raised.

        A failed rank leaves the others blocked in a collective, so nothing waits on them after it.
        """
        results: dict[int, Any] = {}
        while len(results) < len(self._conns):
            waiting = {c: r for r, c in enumerate(self._conns) if r not in results}
            sentinels = {self._procs[r].sentinel: r for r in waiting.values()}
            for ready in wait([*waiting, *sentinels]):
                if ready in sentinels:
                    rank = sentinels[ready]
                    if rank in results or self._conns[rank].poll():
                        continue  # answered, then exited: read the answer first
                    code = self._procs[rank].exitcode
                    self._fail(f"learner rank {rank}: process exited with code {code}{LOST_HINT}", RankLost)
                rank = waiting[ready]  # type: ignore[index]
                status, value = ready.recv()  # type: ignore[union-attr]
                if status != "ok":
                    self._fail(f"learner rank {rank}: {value}")
                results[rank] = value
        return [results[r] for r in range(len(self._conns))]

    def _fail(self, message: str, kind: type[RankError] = RankError) -> None:
        for proc in self._procs:
            proc.kill()
        self.close()
        raise kind(message)

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    _send(conn, ("close", ()))
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self._procs, self._conns = [], []


def _send(conn: Connection, call: tuple[str, Any]) -> None:
    """A call to a rank, by copy (the module docstring says why)."""
    conn.send_bytes(pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))
