"""Episode start latency for a Harbor task whose image is cached: from the warm pool, and cold.

    PYTHONPATH=. .venv/bin/python benchmarks/harbor_start.py [--starts 40] [--quick] [--docker-host unix:///...]

An episode's start is `start_container(task, pool)` (envs/harbor/image.py), what HarborEnv does at its first
command: the task image's cache check, then a running container with the task's limits. Measured N times:
- warm: the pool (warm=2) has a container ready, as when episodes arrive no faster than the pool refills;
  before each start the benchmark waits for the refill (not timed);
- cold: warm=0, every start is docker's create + start + the lifeline exec.
Each start is followed by a first command (`true`), timed apart: the time to the agent's first output.
The task image is built once before timing. With no engine at --docker-host / DOCKER_HOST, a private
dockerd is started for the run and stopped after it (needs root). Goal (issue 59): warm p50 <= 300 ms on
these 2 cores. Writes benchmarks/results/harbor_start.{json,md}, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.harbor.generate import write_task  # noqa: E402
from envs.harbor.image import ensure_base, start_container, task_image  # noqa: E402
from envs.harbor.private_dockerd import docker_engine  # noqa: E402
from envs.harbor.task import load_task  # noqa: E402
from sandboxes.task_containers import ContainerPool  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GOAL_MS = 300.0


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1e3


def summary(starts: list[float], first: list[float]) -> dict[str, float | int]:
    return {
        "n": len(starts),
        "start_p50_ms": pct(starts, 50),
        "start_p90_ms": pct(starts, 90),
        "first_command_p50_ms": pct(first, 50),
        "first_command_p90_ms": pct(first, 90),
    }


def measure(pool: ContainerPool, task, n: int, *, warm: bool) -> dict[str, float | int]:
    starts, first = [], []
    spec = None
    for _ in range(n):
        if warm and spec is not None:
            deadline = time.monotonic() + 120
            while pool.ready(spec) == 0 and time.monotonic() < deadline:
                time.sleep(0.01)  # the refill (not timed): episodes arriving no faster than the pool refills
        t0 = time.perf_counter()
        c = start_container(task, pool)
        t1 = time.perf_counter()
        res = c.exec("true", timeout_s=30)
        t2 = time.perf_counter()
        assert res.exit_code == 0, res
        spec = c.spec
        starts.append(t1 - t0)
        first.append(t2 - t1)
        pool.release(c)
    return summary(starts, first)


def versions(pool: ContainerPool) -> dict[str, str]:
    import docker

    return {
        "python": platform.python_version(),
        "docker_engine": pool.client.version().get("Version", "?"),
        "docker_py": docker.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=40)
    p.add_argument("--quick", action="store_true", help="10 starts each")
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--out", type=Path, default=RESULTS / "harbor_start")
    args = p.parse_args(argv)
    n = 10 if args.quick else args.starts
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, docker_engine(args.docker_host) as host:
        task = load_task(write_task(Path(tmp), 0))
        rows = {}
        for name, warm in (("warm", 2), ("cold", 0)):
            pool = ContainerPool(host, run=f"bench-start-{os.getpid()}-{name}", pool="bench", warm=warm)
            try:
                ensure_base(pool)
                task_image(task, pool)  # cached before timing
                pool.release(start_container(task, pool))  # the pool's first fill, not timed
                rows[name] = measure(pool, task, n, warm=warm > 0)
            finally:
                pool.close()
            print(name, json.dumps(rows[name]), flush=True)
        vers = versions(pool)
    load_after = os.getloadavg()
    cpus = os.cpu_count() or 1
    shared = max(load_before[0], load_after[0]) > cpus
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": cpus, "platform": platform.platform(), "processor": platform.machine()},
        "load_before": load_before,
        "load_after": load_after,
        "shared_machine": shared,
        "versions": vers,
        "goal_warm_p50_ms": GOAL_MS,
        "goal_reached": rows["warm"]["start_p50_ms"] <= GOAL_MS,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    lb, la = r["load_before"], r["load_after"]
    lines = [
        "# Harbor episode start latency (cached task image)",
        "",
        f"`PYTHONPATH=. .venv/bin/python benchmarks/harbor_start.py` — {r['date']}, {r['machine']['cpus']} CPUs, "
        f"{r['machine']['platform']}; Python {r['versions']['python']}, Docker engine "
        f"{r['versions']['docker_engine']}, docker-py {r['versions']['docker_py']}.",
        f"Load average (1/5/15 min) before {lb[0]:.1f}/{lb[1]:.1f}/{lb[2]:.1f}, after {la[0]:.1f}/{la[1]:.1f}/{la[2]:.1f}.",
    ]
    if r["shared_machine"]:
        lines.append(
            "**The machine was shared** (load above its CPU count): these are figures under that load, "
            "not idle-machine figures."
        )
    lines += [
        "",
        "| start | n | start p50 ms | start p90 ms | first command p50 ms | first command p90 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in r["results"].items():
        lines.append(
            f"| {name} | {row['n']} | {row['start_p50_ms']:.1f} | {row['start_p90_ms']:.1f} | "
            f"{row['first_command_p50_ms']:.1f} | {row['first_command_p90_ms']:.1f} |"
        )
    verdict = "reached" if r["goal_reached"] else "NOT reached"
    lines += [
        "",
        f"Goal: warm start p50 <= {r['goal_warm_p50_ms']:.0f} ms — {verdict}. warm: a container from the pool "
        "(warm=2, refilled between starts, refill not timed); cold: warm=0, docker create + start + lifeline "
        "exec. First command: `true` by `docker exec` in the new container.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
