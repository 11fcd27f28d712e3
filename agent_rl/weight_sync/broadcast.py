"""`engines.weight_sync: nccl`: learner rank 0 broadcasts the weights straight to the engines' processes.

torch.distributed broadcast over a group of learner rank 0 + every engine rank (agent_rl/weights/group.py):
NCCL when rank 0 holds a GPU, gloo on CPU. Formed once: the engines' `/init_weights_update_group`
requests run on the rollout loop while rank 0 joins. Each push: the engines get
`/update_weights_from_distributed` (names, dtypes, shapes, version) on the loop while rank 0
broadcasts; both must finish. Either side is blocking until the other arrives, so each pairing
waits on both at once and the first failure is raised (instead of waiting out a process-group
timeout for a peer that has already given up); a learner rank found gone is raised before the engines'
failure it caused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from agent_rl.engines.api import BadRequest, EngineClient, EngineError, WeightGroupMember
from agent_rl.errors import UserError
from agent_rl.weights.group import GroupSpec, TensorMeta, WeightGroupError

if TYPE_CHECKING:
    from agent_rl.learners.api import Learner
    from agent_rl.loop_thread import LoopThread

log = logging.getLogger(__name__)
T = TypeVar("T")


class WeightBroadcast:
    """The weight group of one run: `connect` once, then `update` per push (engines already paused)."""

    def __init__(self, engine: EngineClient, loop: LoopThread):
        if not isinstance(engine, WeightGroupMember):
            raise EngineError(
                f"engines.weight_sync: nccl needs engines that join a weight group over HTTP (SGLang servers, "
                f"or embedded engines with engines.count >= 2); {type(engine).__name__} does not: "
                "use weight_sync: memory for the in-process engine"
            )
        self.engine: WeightGroupMember = engine
        self.loop = loop
        self.group_name = f"agent-rl-{uuid.uuid4().hex[:12]}"  # a fresh name per run: servers outlive runs
        self.meta: TensorMeta | None = None

    def connect(self, learner: Learner) -> None:
        """Form the group: world = 1 (learner rank 0) + every engine's tp ranks."""
        engine_ranks = self.loop.call(self.engine.weight_group_size())
        endpoint = learner.weight_endpoint(self.engine.host())
        spec = GroupSpec(endpoint, 1 + engine_ranks, self.group_name)
        log.info(
            "weight group %s: learner rank 0 at %s:%d (%s), %d engine ranks",
            spec.group_name, endpoint.address, endpoint.port, endpoint.backend, engine_ranks,
        )  # fmt: skip
        self.meta = together(
            self.loop, self.engine.init_weights_update_group(spec, 1), lambda: learner.join_weight_group(spec)
        )

    def update(self, learner: Learner, version: int) -> None:
        """Send the learner's current weights as `version` (after `connect`, with the engines paused). Engines
        lost, added or back since the group formed (a pool's `needs_regroup`) get a new group first; a member
        lost during the send is dropped and the send is made once more."""
        if self.meta is None:
            raise RuntimeError("WeightBroadcast.update before connect")
        for attempt in (0, 1):
            if getattr(self.engine, "needs_regroup", False):
                self.regroup(learner)
            assert self.meta is not None
            coro = self.engine.update_weights_from_distributed(
                self.meta, version=version, group_name=self.group_name
            )
            try:
                together(self.loop, coro, learner.broadcast_weights, settle_s=120.0)
                return
            except (EngineError, WeightGroupError) as e:
                if attempt or not getattr(self.engine, "needs_regroup", False):
                    raise
                log.warning("weight broadcast lost a member (%s); forming a new group without it", e)

    def regroup(self, learner: Learner) -> None:
        """Leave the current group and form a new one with the engines serving now."""
        with contextlib.suppress(EngineError):
            self.loop.call(self.engine.destroy_weights_update_group(self.group_name), timeout=60)
        self.group_name = f"agent-rl-{uuid.uuid4().hex[:12]}"
        self.connect(learner)

    def close(self) -> None:
        """Leave the group on the engines (best effort: a stopped engine has nothing to leave)."""
        if self.meta is None:
            return
        self.meta = None
        with contextlib.suppress(EngineError):
            self.loop.call(self.engine.destroy_weights_update_group(self.group_name), timeout=60)


def together(
    loop: LoopThread, coro: Coroutine[Any, Any, Any], fn: Callable[[], T], *, settle_s: float = 0.0
) -> T:
    """Run `coro` on the loop and `fn` on a daemon thread at once; return fn's result once both finished.

    The first failure is raised once its partner has also finished, or after `settle_s` (0, or the engines
    refused the request: at once). A
    partner still blocked in the collective stays so until the group's timeout; it runs on a daemon thread,
    so it does not keep the process alive. Waiting for it lets a caller reuse the learner afterwards.
    """
    remote = asyncio.run_coroutine_threadsafe(coro, loop.loop)
    local: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            local.set_result(fn())
        except BaseException as e:
            local.set_exception(e)

    threading.Thread(target=run, name="weight-broadcast", daemon=True).start()
    done, _ = concurrent.futures.wait([remote, local], return_when=concurrent.futures.FIRST_EXCEPTION)
    refused = remote in done and isinstance(remote.exception(), BadRequest)
    if len(done) < 2 and settle_s and not refused:  # a refusal cannot succeed by regrouping: no point waiting
        done, _ = concurrent.futures.wait([remote, local], timeout=settle_s)
        if local not in done:  # the learner is still in the collective: it cannot be called again safely
            raise EngineError(
                f"the weight broadcast failed and the learner did not return within {settle_s:.0f} s"
            )
    failures = [f.exception() for f in (remote, local) if f in done and f.exception() is not None]
    if failures:
        # a learner rank that is gone (RankLost, a UserError that says how to resume) is why the engines' side
        # failed too (their peer reset the connection): that is the failure to report, not the engines' 500
        raise next((e for e in failures if isinstance(e, UserError)), failures[0])  # type: ignore[misc]
    remote.result()
    return local.result()
