"""The Docker engine connection and container hygiene: labels, self-removal, orphan removal.

Every sandbox container carries labels saying it is ours, which pool and run it serves, and
which process owns it (host, pid, process start time: a pid alone may be reused). Containers
leave in three ways, so none outlives its owner for long:
- the pool removes them when it closes (`agent-rl sandbox serve` closes it on SIGTERM/SIGINT);
- each container's main process is a watchdog that exits once the fork-server exec is gone
  (the owner died, so its exec stream closed), and the engine auto-removes the container;
- at start, a new pool removes containers with our label whose owner is gone (the engine was
  restarted under them, or they predate the watchdog).
docker-py is imported lazily.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache
from typing import Any

from sandboxes.api import SandboxError

LABEL = "agent-rl.sandbox"
"""Every container we start has this label (value "1")."""
LABEL_POOL = "agent-rl.pool"
LABEL_RUN = "agent-rl.run"
LABEL_OWNER = "agent-rl.owner"
"""host:pid:start-time of the process that owns the container."""

# The container's main process: exits once a process other than the init and itself has existed
# (/proc/loadavg's last pid, in the container's pid namespace, is newer than the watchdog) and none is
# left, or when none started within 120 s; the container then stops and --rm removes it. Any process
# counts, not only the fork-server: while `docker exec` sets the fork-server up, its process is already in
# the namespace under another command line, and a watchdog looking for the fork-server's command line
# alone saw "started, none alive" in that window and stopped the container under it (CI, a busy machine).
# The order of the two probes matters: "started" is read before "alive", so a process created between
# them is seen alive. Read the other way round (as it was until CI failed so), an exec's first process
# created after the alive probe and before the started probe read as "started, none alive", and the
# container stopped under its fork-server before the handshake (tests/sandboxes/test_watchdog.py plays
# every interleaving). Sandboxed processes left behind by a dead fork-server keep the container until
# their rlimits end them. `watch` is plain Python of the image's interpreter: nothing of ours is there.
WATCHDOG_LOOP = (
    "def watch(started, alive, elapsed, sleep, patience=120.0):\n"
    "    while True:\n"
    "        seen = started()\n"
    "        if not alive() and (seen or (elapsed() > patience and not started())):\n"
    "            return\n"
    "        sleep(1)\n"
)
WATCHDOG = WATCHDOG_LOOP + (
    "import os, time\n"
    "me, start = os.getpid(), time.monotonic()\n"
    "watch(\n"
    "    lambda: int(open('/proc/loadavg').read().split()[-1]) > me,\n"
    "    lambda: any(p.isdigit() and int(p) not in (1, me) for p in os.listdir('/proc')),\n"
    "    lambda: time.monotonic() - start,\n"
    "    time.sleep,\n"
    ")\n"
)


def docker_client(docker_host: str | None) -> Any:
    try:
        import docker
    except ImportError as e:
        raise SandboxError("the docker backend needs the docker python package: pip install docker") from e
    try:
        client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
        client.ping()
    except Exception as e:
        raise SandboxError(
            f"docker backend: cannot reach a Docker engine at {docker_host or 'DOCKER_HOST/default socket'} ({e}); "
            "install docker.io (scripts/install_system_deps.sh) and start dockerd"
        ) from e
    return client


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if it is gone."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()  # noqa: SIM115
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()


@cache
def owner_id(pid: int | None = None) -> str:
    """host:pid:start-time of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label still runs; unknown (another host) counts as alive."""
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    return _start_time(int(pid)) == started


@dataclass(frozen=True)
class Labels:
    pool: str
    run: str

    def as_dict(self) -> dict[str, str]:
        return {LABEL: "1", LABEL_POOL: self.pool, LABEL_RUN: self.run, LABEL_OWNER: owner_id()}


def our_containers(client: Any, **labels: str) -> list[Any]:
    """Containers (running or not) with our label, and these label values when given. One removed (`--rm`)
    between docker-py's listing and its inspect of each is left out, not an error."""
    wanted = [LABEL] + [f"{k}={v}" for k, v in labels.items()]
    return client.containers.list(all=True, filters={"label": wanted}, ignore_removed=True)


def remove_orphans(client: Any) -> list[str]:
    """Remove our containers whose owner process is gone; returns their short ids."""
    removed = []
    for container in our_containers(client):
        if owner_alive(container.labels.get(LABEL_OWNER, "")):
            continue
        try:
            container.remove(force=True)
        except Exception as e:  # already gone (auto-removal raced us): nothing to do
            if "No such container" not in str(e) and "already in progress" not in str(e):
                raise SandboxError(
                    f"docker backend: cannot remove orphan container {container.short_id}: {e}"
                ) from e
        removed.append(container.short_id)
    return removed
