"""Which CPU cores each process of the production topology gets, and pinning a process to them.

`assign` is a pure function (unit-tested without processes); `pin` applies one entry inside the
process it names: CPU affinity (os.sched_setaffinity) plus torch's intra-op thread count equal to
the core count, so "engine on core 0, learner on core 1" is what the kernel enforces, not two
processes each running two torch threads over both cores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Cores = tuple[int, ...]


@dataclass(frozen=True)
class CoreMap:
    """Cores per process: one entry per engine server, one per learner rank, and the driver's."""

    engines: tuple[Cores, ...]
    learner_ranks: tuple[Cores, ...]
    rollout: Cores

    def lines(self) -> list[str]:
        """Human-readable, one process per line (for `--dry-run` and the run log)."""
        out = [
            f"engine server {i}: cores {list(c)} ({len(c)} torch thread(s))"
            for i, c in enumerate(self.engines)
        ]
        out += [
            f"learner rank {r}: cores {list(c)} ({len(c)} torch thread(s))"
            for r, c in enumerate(self.learner_ranks)
        ]
        out.append(f"driver (rollout workers, buffer, sandbox callers): cores {list(self.rollout)}")
        return out


def available() -> Cores:
    """The cores this process may run on (respects an outer taskset / cgroup cpuset)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def assign(
    explicit: Mapping[str, Sequence[int]] | None, *, engines: int, learner_ranks: int, cpus: Sequence[int]
) -> CoreMap:
    """Cores per process. `explicit` (placement.cores) wins per role; the rest is split automatically:
    learner ranks on the upper half of `cpus` (at least one core each when there are enough), engines on the
    lower half, the driver on every core (unpinned). With fewer cores than processes, they share round-robin."""
    cpus = tuple(cpus)
    explicit = dict(explicit or {})
    for role, ids in explicit.items():
        if bad := sorted(set(ids) - set(cpus)):
            raise ValueError(
                f"placement.cores.{role}: core(s) {bad} are not available to this process "
                f"(available: {list(cpus)}); pick ids from that list"
            )
    n_learn = max(1, len(cpus) // 2) if len(cpus) > 1 else 1
    learner_pool = tuple(explicit.get("learner", cpus[len(cpus) - n_learn :]))
    engine_pool = tuple(explicit.get("engine", cpus[: max(1, len(cpus) - n_learn)]))
    # The driver (and the sandbox processes it starts) is not pinned by default: its load comes in bursts
    # (tool calls, HTTP, tokenizing) that the kernel fits into the engine's and learner's idle time. Pinned
    # to either core it slowed that core's process on tiny_chain (benchmarks/async_vs_sync.py, docs/benchmarks/async-vs-sync.md).
    rollout = tuple(explicit.get("rollout", cpus))
    return CoreMap(
        engines=_split(engine_pool, engines),
        learner_ranks=_split(learner_pool, learner_ranks),
        rollout=rollout,
    )


def _split(pool: Cores, n: int) -> tuple[Cores, ...]:
    """`n` processes over `pool`: contiguous equal shares when there are enough cores, else shared round-robin."""
    if n <= 0:
        return ()
    if len(pool) >= n:
        per = len(pool) // n
        return tuple(pool[i * per : (i + 1) * per] if i < n - 1 else pool[i * per :] for i in range(n))
    return tuple((pool[i % len(pool)],) for i in range(n))


def pin(cores: Sequence[int]) -> None:
    """Pin this process to `cores` and size torch's thread pools to match (call early, before heavy work)."""
    os.sched_setaffinity(0, set(cores))
    import torch

    torch.set_num_threads(len(cores))
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel op
        torch.set_num_interop_threads(1)
