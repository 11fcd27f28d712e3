"""A Ray cluster of several nodes on one machine, for the multi-node tests and the reliability benchmark.

Ray's own test utility (`ray.cluster_utils.Cluster`) starts a head and one raylet per node, each with its
own CPUs and custom resources: a node kind of a recipe's `placement.nodes` is a custom resource, so
"engines on node A, learner on node B" is real Ray placement between real raylets. Killing a node
(`kill`) stops its raylet and every process Ray started there, as a lost machine would. Each node has an
address of its own on the loopback network (all of 127.0.0.0/8 is this machine): the head (and the driver)
127.0.0.1, the nodes 127.0.0.2, 127.0.0.3, ... in the order they join (a replacement gets a new one). A
raylet and the workers it starts inherit AGENT_RL_NODE_IP, so the servers and rendezvous the project starts
on a node listen on that node's address (`hosts.node_ip`), as on separate machines; Ray itself still
advertises the machine's address. Only what this object starts is stopped (never `ray stop`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LocalCluster:
    """`nodes`: name -> (kind, cpus). The head node (the driver's) has `head_cpus` CPUs and no kind."""

    nodes: dict[str, tuple[str, int]]
    head_cpus: int = 1
    _cluster: Any = None
    _handles: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, str] = field(
        default_factory=dict
    )  # node name -> Ray node id (kept after the node is lost)
    ips: dict[str, str] = field(
        default_factory=dict
    )  # node name -> its address (kept after the node is lost)

    HEAD_IP = "127.0.0.1"

    def __post_init__(self) -> None:
        os.environ["RAY_AUTH_MODE"] = "disabled"  # a private test cluster
        os.environ["AGENT_RL_NODE_IP"] = self.HEAD_IP  # the head's raylet and the driver (started from here)
        # Ray's memory monitor kills workers when the machine is near full; on a shared machine that is mostly
        # other people's memory, and a killed worker would read as one of the faults under test.
        os.environ["RAY_memory_monitor_refresh_ms"] = "0"  # noqa: SIM112 (Ray reads this exact name)
        # Ray starts workers at nice 15: beside two CPU burners (the suite's load test) a fresh clone's engine
        # servers and learner ranks then took minutes to start and a 3-step run passed its 600 s limit.
        os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112
        from ray.cluster_utils import Cluster

        t0 = time.monotonic()
        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": self.head_cpus, "include_dashboard": False},
        )
        try:
            for name, (kind, cpus) in self.nodes.items():
                self.add(name, kind, cpus)
        except BaseException:
            self.shutdown()  # a node that did not come up: stop those that did (no `with` block will)
            raise
        self.start_s = time.monotonic() - t0

    @property
    def address(self) -> str:
        return self._cluster.address

    def add(self, name: str, kind: str, cpus: int) -> None:
        """A node of `kind` joins (a replacement, or the cluster growing), on the next unused 127.0.0.x."""
        ip = f"127.0.0.{len(self.ips) + 2}"
        os.environ["AGENT_RL_NODE_IP"] = ip  # the raylet starts now and keeps this environment
        try:
            self._handles[name] = self._cluster.add_node(num_cpus=cpus, resources={kind: 1.0})
        finally:
            os.environ["AGENT_RL_NODE_IP"] = self.HEAD_IP
        self.nodes[name], self.ips[name] = (kind, cpus), ip
        self.ids[name] = self._handles[name].node_id

    def node_id(self, name: str) -> str:
        return self.ids[name]

    def kill(self, name: str) -> None:
        """The node is lost: its raylet and every worker and server Ray started there die at once."""
        self._cluster.remove_node(self._handles.pop(name), allow_graceful=False)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
