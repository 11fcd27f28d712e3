"""The running engines of a job, and their membership: replicas added to or removed from a running job.

`Engines` owns what was started (local server processes, Ray actors) behind one client. With a pool
(`EnginePool`), replicas can join and leave while training runs:

- by hand: `agent-rl engines add|remove|list RUN_DIR` appends a request to RUN_DIR/engines/requests.jsonl;
  the job (this module's watcher, on the rollout loop) applies it and answers in answers.jsonl; members.json
  always lists the members, their state and node;
- by the cluster: with `engines.max_count` on Ray, one reservation for the next replica is kept pending; when
  the cluster gains room (a node joins, e.g. by Ray's autoscaler, which sees the pending reservation as demand)
  the replica starts there. A replica whose node is lost is routed around by the pool.

A new replica takes no work until it holds the current weights (the pool's "joining" state); a leaving one
drains, and what is still running after `drain_s` is aborted and continued on the others. Files, not an RPC
server: the run dir is the one address a user already has, and a request survives a busy loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent_rl.engines.api import EngineClient, EngineError
from agent_rl.engines.pool import EnginePool

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 1.0


@dataclass
class Replica:
    """One engine server of the job: its handle (a local server process, a Ray actor, or None for a server
    someone else started), the Ray placement group holding its resources, and where it runs."""

    url: str
    handle: Any = None
    pg: Any = None
    node: str = ""


class Starter(Protocol):
    """Starts and stops this job's replicas (placement implements it, locally or through Ray)."""

    async def start(self, i: int) -> Replica:
        """Replica number i of the job (i offsets its seed); waits for room in the cluster."""
        ...

    async def try_start(self, i: int) -> Replica | None:
        """Replica i if the cluster has room now; else None, keeping a reservation pending (autoscaler demand)."""
        ...

    async def stop(self, r: Replica) -> None: ...

    async def lost(self, r: Replica) -> bool:
        """Whether the replica's process is gone for good (its node lost); its resources are then released."""
        ...

    async def release(self) -> None:
        """Drop a pending reservation."""
        ...

    def client(self, url: str) -> EngineClient: ...


@dataclass
class Engines:
    """The running engines behind one client; `close()` stops what was started here.

    Local server replicas are supervised: one that dies is started again on the same port, and the pool's
    health check brings it back with the latest weights (meanwhile it is routed around)."""

    client: EngineClient
    replicas: list[Replica] = field(default_factory=list)
    starter: Starter | None = None
    relaunch: Callable[[str, int], Any] | None = None  # (url, port) -> new local server handle
    restarts: int = 0
    max_count: int | None = None
    placed: Callable[[], list[dict[str, str]]] = list  # every process placed on Ray, for placement.json
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _growing: asyncio.Task | None = None
    _started: int = 0  # replicas ever started (the next one's seed offset)

    @property
    def handles(self) -> list[Any]:
        return [r.handle for r in self.replicas if r.handle is not None]

    @property
    def pool(self) -> EnginePool | None:
        return self.client if isinstance(self.client, EnginePool) else None

    def __post_init__(self) -> None:
        self._started = len(self.replicas)

    # ---- membership ----
    async def add(self, count: int = 1, url: str | None = None) -> list[str]:
        """Start `count` replicas (or join the server at `url`); they take work once they hold the weights."""
        pool = self._need_pool()
        if url is not None:
            new = [Replica(url.rstrip("/"))]
        else:
            if self.starter is None:
                raise EngineError("this job's engines are servers at engines.urls: add one with --url URL")
            new = list(await asyncio.gather(*(self.starter.start(self._next()) for _ in range(count))))
        for r in new:
            await self._join(pool, r)
        if self.max_count:  # by hand: the ceiling the cluster grows to moves with it
            self.max_count += len(new)
        return [r.url for r in new]

    async def remove(self, name: str, drain_s: float = 60.0) -> str:
        """Drain and drop the replica named by its URL (or its index in `members.json`), stop what it runs."""
        pool = self._need_pool()
        member = next((m for m in pool.members if m.name == name.rstrip("/")), None)
        if member is None and name.isdigit() and int(name) < len(pool.members):
            member = pool.members[int(name)]
        if member is None:
            raise EngineError(f"no engine {name!r} in this job (members: {[m.name for m in pool.members]})")
        aborted = await pool.remove(member, drain_s)
        if self.max_count:
            self.max_count = max(1, self.max_count - 1)
        replica = next((r for r in self.replicas if r.url == member.name), None)
        if replica is not None:
            self.replicas.remove(replica)
            if self.starter is not None and replica.handle is not None:
                await self.starter.stop(replica)
        return f"removed {member.name} ({aborted} turn(s) aborted and continued elsewhere)"

    def members(self) -> list[dict[str, Any]]:
        pool = self.pool
        if pool is None:
            return [
                {"name": "in-process engine", "state": "live", "node": "driver", "in_flight": 0, "served": 0}
            ]
        nodes = {r.url: r.node for r in self.replicas}
        return [
            {"name": m.name, "state": m.state, "node": nodes.get(m.name, "external"), "in_flight": m.in_flight,
             "served": m.served}
            for m in pool.members
        ]  # fmt: skip

    async def _join(self, pool: EnginePool, r: Replica) -> None:
        self.replicas.append(r)
        await pool.add(self.starter.client(r.url) if self.starter else _client(r.url), r.url)
        log.info("engine %s joined on %s", r.url, r.node or "?")

    def _next(self) -> int:
        self._started += 1
        return self._started - 1

    def _need_pool(self) -> EnginePool:
        if self.pool is None:
            raise EngineError(
                "this run's single engine runs inside the driver: start it with engines.count >= 2 (or "
                "placement.topology: processes) to add or remove replicas while it runs"
            )
        return self.pool

    # ---- background work (on the rollout loop) ----
    def supervise(self, interval_s: float = 1.0) -> None:
        if self.relaunch is not None:
            self._tasks.append(asyncio.create_task(self._supervise(interval_s)))

    def watch(self, run_dir: Path | None) -> None:
        """Serve membership requests from `run_dir` and, with max_count, grow into the cluster's free room."""
        if run_dir is not None:
            Mailbox(run_dir).write_members(self.members(), self.placed())
        if self.pool is not None and (run_dir is not None or self.max_count):
            self._tasks.append(asyncio.create_task(self._watch(run_dir)))

    async def _supervise(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            for r in self.replicas:
                h = r.handle
                if self.relaunch is not None and hasattr(h, "process") and h.process.poll() is not None:
                    log.warning("engine server %s exited with %s; restarting it", h.url, h.process.returncode)
                    try:
                        port = int(h.url.rsplit(":", 1)[1].split("/")[0])
                        r.handle = await asyncio.to_thread(self.relaunch, h.url, port)
                    except (RuntimeError, TimeoutError, OSError) as e:  # next round; the pool routes around
                        log.error("restarting engine server %s failed: %s", h.url, e)
                        continue
                    self.restarts += 1

    async def _watch(self, run_dir: Path | None) -> None:
        box = Mailbox(run_dir) if run_dir is not None else None
        while True:
            try:
                if box is not None:
                    for req in box.new_requests():
                        box.answer(req["id"], *await self._apply(req))
                    box.write_members(self.members(), self.placed())
                if self.starter is not None:
                    await self._reap()
                if self.max_count and self.starter is not None:
                    await self._grow()
            except Exception:  # the job goes on with the engines it has; the next round tries again
                log.exception("engine membership: a round failed")
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def _apply(self, req: dict[str, Any]) -> tuple[bool, str]:
        try:
            if req["op"] == "add":
                return True, f"added {', '.join(await self.add(int(req.get('count') or 1), req.get('url')))}"
            if req["op"] == "remove":
                return True, await self.remove(str(req["name"]), float(req.get("drain_s", 60.0)))
            return False, f"unknown op {req['op']!r}"
        except (EngineError, RuntimeError, TimeoutError, OSError, ValueError) as e:
            return False, str(e).splitlines()[0]

    async def _reap(self) -> None:
        """Drop replicas whose process is gone for good (a lost node): the pool routes around them already; their
        reservation is released, so the room a new node brings goes to a new replica (engines.max_count)."""
        pool, starter = self._need_pool(), self.starter
        assert starter is not None
        dead = {m.name: m for m in pool.members if m.state == "dead"}
        for r in [r for r in self.replicas if r.url in dead and r.handle is not None]:
            if await starter.lost(r):
                log.warning("engine %s is lost with its node; dropping it", r.url)
                self.replicas.remove(r)
                await pool.remove(dead[r.url], drain_s=0.0)
                await starter.stop(r)

    async def _grow(self) -> None:
        """Below max_count, keep a reservation pending; once granted, start a replica there. In a task of its own:
        the mailbox keeps answering while a server loads."""
        pool = self._need_pool()
        serving = sum(m.state in ("live", "joining") for m in pool.members)
        if serving < (self.max_count or 0) and (self._growing is None or self._growing.done()):
            self._growing = asyncio.create_task(self._grow_one(pool))

    async def _grow_one(self, pool: EnginePool) -> None:
        assert self.starter is not None
        try:
            r = await self.starter.try_start(self._started)
            if r is not None:
                self._started += 1
                await self._join(pool, r)
        except Exception:
            log.exception("engine membership: starting a replica failed; trying again")

    async def close(self) -> None:
        tasks = self._tasks + ([self._growing] if self._growing is not None else [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.close()  # first: no request is in flight when the servers go away
        for r in self.replicas:
            if hasattr(r.handle, "process"):  # a local server process
                await asyncio.to_thread(r.handle.stop)
            elif r.handle is not None and self.starter is not None:
                await self.starter.stop(r)
        if self.starter is not None:
            await self.starter.release()


def _client(url: str) -> EngineClient:
    from agent_rl.engines.client import SGLangClient

    return SGLangClient(url)


# ---- the run dir as the job's mailbox -----------------------------------------------------------------------


class Mailbox:
    """RUN_DIR/engines/: requests.jsonl (appended by `agent-rl engines`), answers.jsonl and members.json (the job)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "engines"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.requests, self.answers, self.state = (
            self.dir / "requests.jsonl",
            self.dir / "answers.jsonl",
            self.dir / "members.json",
        )
        self._offset = self.requests.stat().st_size if self.requests.exists() else 0  # not a resumed run's

    def new_requests(self) -> list[dict[str, Any]]:
        if not self.requests.exists():
            return []
        with open(self.requests, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        done = data.rfind(b"\n") + 1  # a line still being written waits for the next round
        self._offset += done
        return [json.loads(line) for line in data[:done].splitlines() if line.strip()]

    def answer(self, rid: str, ok: bool, message: str) -> None:
        with open(self.answers, "a") as f:
            f.write(json.dumps({"id": rid, "ok": ok, "message": message}) + "\n")

    def write_members(self, members: list[dict[str, Any]], placed: list[dict[str, str]]) -> None:
        """members.json (the engines), and RUN_DIR/placement.json: every process placed on Ray, by node id."""
        for path, data in ((self.state, {"pid": os.getpid(), "time": time.time(), "members": members}),
                           (self.dir.parent / "placement.json", {"processes": placed})):  # fmt: skip
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)


def request(run_dir: Path, req: dict[str, Any], *, timeout_s: float) -> tuple[bool, str]:
    """Send one request to the job training in `run_dir` and wait for its answer."""
    box = Path(run_dir) / "engines"
    state = box / "members.json"
    if not state.exists() or not _alive(json.loads(state.read_text())["pid"]):
        raise FileNotFoundError(
            f"{run_dir}: no running job serves engine requests here ({state} missing or its process gone); "
            "start `agent-rl train` first (engines.count >= 2 or placement.topology: processes)"
        )
    rid = uuid.uuid4().hex
    with open(box / "requests.jsonl", "a") as f:
        f.write(json.dumps({"id": rid, **req}) + "\n")
    deadline, pid = time.monotonic() + timeout_s, json.loads(state.read_text())["pid"]
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            for line in (box / "answers.jsonl").read_text().splitlines():
                a = json.loads(line)
                if a["id"] == rid:
                    return bool(a["ok"]), str(a["message"])
        if not _alive(pid):
            raise RuntimeError(f"{run_dir}: the job (process {pid}) ended before it answered {req}")
        time.sleep(0.2)
    raise TimeoutError(f"{run_dir}: no answer to {req} within {timeout_s:.0f} s (is the job stuck?)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    """`agent-rl engines add|remove|list RUN_DIR`: change a running job's engine replicas."""
    import argparse

    from agent_rl import errors

    p = argparse.ArgumentParser(prog="agent-rl engines", description=main.__doc__)
    sub = p.add_subparsers(dest="op", required=True)
    add = sub.add_parser("add", help="start replicas where placement.engine says (or join a running server)")
    add.add_argument("run_dir", type=Path)
    add.add_argument("--count", type=int, default=1)
    add.add_argument("--url", help="join a server someone else started (same model) instead")
    rm = sub.add_parser(
        "remove", help="drain a replica (its turns continue elsewhere after --drain-s) and stop it"
    )
    rm.add_argument("run_dir", type=Path)
    rm.add_argument("name", help="the replica's URL or its index in `agent-rl engines list`")
    rm.add_argument("--drain-s", type=float, default=60.0)
    ls = sub.add_parser("list", help="the job's replicas, their state and node")
    ls.add_argument("run_dir", type=Path)
    for s in (add, rm):
        s.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the job's answer")
    args = p.parse_args(argv)
    if args.op == "list":
        state = args.run_dir / "engines" / "members.json"
        if not state.exists():
            raise FileNotFoundError(f"{state} not found: is {args.run_dir} a running job's run dir?")
        for i, m in enumerate(json.loads(state.read_text())["members"]):
            print(
                f"{i}  {m['name']}  {m['state']}  node {m['node']}  in flight {m['in_flight']}  served {m['served']}"
            )
        return 0
    req = (
        {"op": "add", "count": args.count, "url": args.url}
        if args.op == "add"
        else {"op": "remove", "name": args.name, "drain_s": args.drain_s}
    )
    ok, message = request(args.run_dir, req, timeout_s=args.timeout)
    print(message if ok else f"agent-rl engines: {message}")
    return 0 if ok else errors.EXIT_USER
