"""Who runs where: a pure function from the recipe to a plan, and the one place Ray is started and asked for room.

`plan(engines, learner, placement)` needs no cluster, so it is unit-tested as a function; with
`placement.nodes` declared it also lays the processes out node by node (`--dry-run` prints it).
`apply(plan)` starts or joins Ray only when the plan needs it: a plain one-machine `agent-rl train`
with one engine and one learner rank runs everything in this process and never starts Ray.

On Ray every process of a role is placed through a placement group (agent_rl/hosts.py does it): it asks
for the role's CPUs and GPUs and, when the role names a node kind, a sliver of the custom resource that
kind of node was started with. Megatron's tensor/context-parallel ranks of one replica share a node (one
STRICT_PACK group each); engine replicas get a group each, so they can come and go.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from agent_rl import cores
from agent_rl.config import EngineConfig, LearnerConfig, PlacementConfig, RoleResources
from agent_rl.cores import CoreMap
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
        return {"CPU": self.cpus} | ({"GPU": self.gpus} if self.gpus else {}) | (self.custom() or {})

    def custom(self) -> dict[str, float] | None:
        """The sliver of its node kind's resource (None: any node)."""
        return {self.node: NODE_SHARE} if self.node else None


@dataclass(frozen=True)
class Plan:
    roles: tuple[Role, ...]
    needs_ray: bool
    address: str | None  # join this cluster; None: start a local instance if needs_ray
    reason: str  # why Ray is (not) needed, for the log and --dry-run
    topology: str = "inprocess"  # placement.topology
    cores: CoreMap | None = None  # processes: which cores each process is pinned to
    layout: tuple[
        tuple[str, tuple[str, ...]], ...
    ] = ()  # (node, what runs there) when placement.nodes is set
    engine_actors: bool = False  # engine replicas are Ray actors
    timeout_s: float = 600.0
    node_kinds: tuple[str, ...] = ()  # placement.nodes: a local Ray instance is given each kind's resource

    def describe(self) -> list[str]:
        """Which process runs what, where (`--dry-run`)."""
        if self.cores is not None:
            return ["topology processes (each process pinned to its cores):", *self.cores.lines()]
        if self.layout:
            how = (
                "each started with `ray start ... --resources '{\"KIND\": 1}'`"
                if self.address
                else ("a local Ray instance: this machine holds every kind")
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
    placed = (
        bool(pc.nodes)
        or pc.sandbox is not None
        or any(r.gpus for r in roles)
        or eng.type == "sglang"
        and n_eng
    )
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
        "learner": f"learner ranks {span}"
        + (f" (model-parallel group {ids.start // r.group})" if r.group > 1 else ""),
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
        quiet: dict[str, Any] = dict(
            log_to_driver=False, logging_level=logging.WARNING, configure_logging=False
        )
        if p.address:
            ray.init(address=p.address, **quiet)
        else:  # a private local instance, not a shared cluster (address="local": never a stale one's)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            # Ray starts its workers at nice 15; here they are our engine replicas and learner ranks, which
            # would lose the CPU to the driver and to anything else on the machine. Same priority as the driver.
            os.environ.setdefault("RAY_worker_niceness", "0")
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


def ray_up() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()
