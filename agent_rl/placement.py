"""Who runs where: a pure function from the recipe to a plan, and the one place Ray is started.

`plan(recipe)` needs no cluster, so it is unit-tested as a function. `apply(plan)` starts
or joins Ray only when the plan needs it: a plain one-machine `agent-rl train` with one
engine and one learner rank runs everything in this process and never starts Ray.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

from agent_rl.config import EngineConfig, ModelConfig, Recipe
from agent_rl.engines.api import EngineClient


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

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)


def plan(recipe: Recipe, address: str | None = None) -> Plan:
    """Roles and resources for a recipe. `address` (the CLI's --address) overrides placement.address."""
    address = address or recipe.placement.address
    eng, lrn = recipe.engines, recipe.learner
    local_engines = eng.count if eng.type == "embedded" else 0
    per_engine_gpus = recipe.placement.engine_gpus / max(local_engines, 1)
    world = lrn.dp * lrn.tp * lrn.cp
    roles = (
        Role("learner", world, 1.0, recipe.placement.learner_gpus / world),
        Role("engine", local_engines, 1.0, per_engine_gpus),
        Role("rollout", 1, 1.0, 0.0),  # asyncio workers: one process, many episodes in flight
    )
    reasons = []  # learner ranks (dp>1) are worker processes of the torch learner itself: no Ray needed
    if local_engines > 1:
        reasons.append(f"{local_engines} embedded engine replicas")
    if address:
        reasons.append(f"--address {address}")
    needs = bool(reasons)
    return Plan(
        roles, needs, address, ", ".join(reasons) if needs else "one learner rank and one engine: no Ray"
    )


def apply(p: Plan) -> bool:
    """Start a quiet local Ray (or join `p.address`) if the plan needs it; returns whether Ray is up."""
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
    """The running engines behind one client; `close()` stops what was started here."""

    client: EngineClient
    handles: list[Any]  # EmbeddedServerHandle per server replica (empty for in-process / external engines)

    async def close(self) -> None:
        await self.client.close()
        for h in self.handles:
            if hasattr(h, "stop"):
                await asyncio.to_thread(h.stop)
            else:  # a Ray actor: killing it stops its server process
                import ray

                ray.kill(h)


async def start_engines(p: Plan, eng: EngineConfig, model: ModelConfig, *, seed: int) -> Engines:
    """One embedded engine runs in this process (weights handed over in memory); several run as
    HTTP server processes behind an EnginePool (least-loaded, sticky, routes around a dead one);
    sglang/vllm are external servers at `eng.urls`. Must run on the rollout event loop."""
    from agent_rl.engines.embedded import EmbeddedEngine

    if eng.type == "embedded" and eng.count == 1:
        client = EmbeddedEngine(
            model.path, max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype, seed=seed
        )
        return Engines(client, [])
    from agent_rl.engines.client import SGLangClient, VLLMClient
    from agent_rl.engines.pool import EnginePool

    handles: list[Any] = []
    if eng.type == "embedded":
        from agent_rl.engines.api import launch_embedded

        kw = dict(max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype)
        if ray_up():  # each replica in a Ray actor, so the cluster decides which node (and GPU) serves it
            handles = [_ray_engine_host(p, model.path, kw, seed + i) for i in range(eng.count)]
            urls = await asyncio.gather(*[asyncio.wrap_future(h.url.remote().future()) for h in handles])
            clients: list[EngineClient] = [SGLangClient(u) for u in urls]
        else:
            for i in range(eng.count):
                handles.append(await asyncio.to_thread(launch_embedded, model.path, seed=seed + i, **kw))
            clients = [h.client() for h in handles]
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

        def __del__(self) -> None:
            self.handle.stop()

    return EngineHost.remote()
