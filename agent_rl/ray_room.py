"""Room on Ray for one role's processes: placement groups, the options that put an actor in a bundle, the
address a node's servers advertise, and the record of what was placed where (RUN_DIR/placement.json).

Below both users: `hosts` (engine and sandbox servers) and the learners' Ray pool place their processes
through these, so neither imports the other. Ray is imported inside each function: importing this module
never starts or needs Ray.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from agent_rl.errors import UserError

if TYPE_CHECKING:
    from agent_rl.placement import Role

PLACED: list[dict[str, str]] = []  # every process this driver placed on Ray: role, which one, node id


def record(role: str, which: str | int, node: str) -> None:
    PLACED.append({"role": role, "which": str(which), "node": node})


def node_ip() -> str:
    """The address servers on this node listen on and advertise: $AGENT_RL_NODE_IP, else Ray's for this node."""
    import ray

    return os.environ.get("AGENT_RL_NODE_IP") or ray.util.get_node_ip_address()


def reserve(
    role: Role, bundles: int, *, strategy: str = "PACK", timeout_s: float = 600.0, wait: bool = True
) -> Any:
    """A placement group of `bundles` processes of `role`; waits (up to timeout_s) until the cluster has room,
    else fails naming what is missing. `wait=False` returns it pending (Ray's autoscaler sees it as demand)."""
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group([role.bundle()] * bundles, strategy=strategy)
    if wait and not ray.wait([pg.ready()], timeout=timeout_s)[0]:
        reserve_failed(role, bundles, strategy, timeout_s, pg)
    return pg


def reserve_failed(role: Role, bundles: int, strategy: str, timeout_s: float, pg: Any) -> None:
    """Give the reservation up and say what was missing."""
    import ray
    from ray.util.placement_group import remove_placement_group

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


def actor_options(role: Role, pg: Any, index: int) -> dict[str, Any]:
    """`.options(...)` for the process in bundle `index` of `pg`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return dict(
        num_cpus=role.cpus,
        num_gpus=role.gpus,
        resources=role.custom(),
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
    )
