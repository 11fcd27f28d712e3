"""Sandbox latency and throughput: p50/p95 per call and calls/s with 1 and 2 concurrent callers.

    .venv/bin/python benchmarks/sandbox_bench.py [--calls 200] [--backends local,unsafe-subprocess,docker]
        [--docker-host unix:///path/docker.sock]

Snippets: `print(1+1)` and a numpy-importing one. Backends: local (bwrap fork-server), local with
numpy preloaded in the fork-server, docker (warm containers; needs a running engine and the image),
unsafe-subprocess, and plain `subprocess.run([python, "-c", code])` as the baseline, all in the
same run. Writes benchmarks/results/sandbox_bench.json and .md (ratios are baseline p50 / p50).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import sandboxes

SNIPPETS = {
    "print": ("print(1+1)", "2\n"),
    "numpy": ("import numpy as np\nprint(int(np.arange(10).sum()))", "45\n"),
}
RESULTS = Path(__file__).resolve().parent / "results"


async def measure(
    call: Callable[[str], Awaitable[str]], code: str, expect: str, calls: int, conc: int
) -> dict:
    for _ in range(3):  # warm up
        assert await call(code) == expect
    latencies: list[float] = []

    async def caller(n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            out = await call(code)
            latencies.append(time.perf_counter() - t0)
            assert out == expect, out

    start = time.perf_counter()
    await asyncio.gather(*(caller(calls // conc) for _ in range(conc)))
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return {
        "p50_ms": q[49] * 1e3,
        "p95_ms": q[94] * 1e3,
        "calls_per_s": len(latencies) / wall,
        "n": len(latencies),
    }


def subprocess_call(code: str) -> Awaitable[str]:
    async def run() -> str:
        return (
            await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True
            )
        ).stdout

    return run()


async def bench_backend(name: str, make: Callable[[], sandboxes.Sandbox] | None, calls: int) -> dict:
    rows: dict = {}
    if make is None:
        for snip, (code, expect) in SNIPPETS.items():
            for conc in (1, 2):
                rows[f"{snip}/c{conc}"] = await measure(subprocess_call, code, expect, calls // 4, conc)
                print(f"  {name:24s} {snip:6s} c={conc}: {rows[f'{snip}/c{conc}']}", flush=True)
        return rows
    async with make() as sb:
        await sb.start()

        async def call(code: str) -> str:
            result = await sb.run(code)
            return result.stdout if result.exit_code == 0 else result.stderr

        for snip, (code, expect) in SNIPPETS.items():
            for conc in (1, 2):
                rows[f"{snip}/c{conc}"] = await measure(call, code, expect, calls, conc)
                print(f"  {name:24s} {snip:6s} c={conc}: {rows[f'{snip}/c{conc}']}", flush=True)
    return rows


def write_markdown(report: dict, path: Path) -> None:
    base = report["results"]["subprocess.run (baseline)"]
    lines = [
        "# Sandbox benchmark",
        "",
        f"{report['machine']}; {report['calls']} calls per cell; {report['note']}",
        "",
        "| backend | snippet | callers | p50 ms | p95 ms | calls/s | speed-up vs subprocess.run (p50) |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, rows in report["results"].items():
        for key, row in rows.items():
            snip, conc = key.split("/")
            ratio = base[key]["p50_ms"] / row["p50_ms"]
            lines.append(
                f"| {backend} | {snip} | {conc[1:]} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} | "
                f"{row['calls_per_s']:.0f} | {ratio:.1f}x |"
            )
    lines += ["", "Targets (issue 4): local p50 <= 5 ms and >= 500 calls/s; docker warm p50 <= 10 ms."]
    path.write_text("\n".join(lines) + "\n")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--backends", default="local,local+preload,unsafe-subprocess,docker")
    parser.add_argument("--docker-host", default=None)
    args = parser.parse_args()
    makers: dict[str, Callable[[], sandboxes.Sandbox] | None] = {"subprocess.run (baseline)": None}
    wanted = args.backends.split(",")
    if "local" in wanted:
        makers["local"] = lambda: sandboxes.create("local", pool_size=2)
    if "local+preload" in wanted:
        makers["local (numpy preloaded)"] = lambda: sandboxes.create("local", pool_size=2, preload=["numpy"])
    if "unsafe-subprocess" in wanted:
        makers["unsafe-subprocess"] = lambda: sandboxes.create(
            "unsafe-subprocess", pool_size=2, allow_unsafe=True
        )
    if "docker" in wanted:
        opts = {"docker_host": args.docker_host} if args.docker_host else {}
        makers["docker"] = lambda: sandboxes.create("docker", pool_size=2, **opts)
    results = {}
    skipped = {}
    for name, make in makers.items():
        print(f"{name}:", flush=True)
        try:
            results[name] = await bench_backend(name, make, args.calls)
        except sandboxes.SandboxError as e:
            skipped[name] = str(e)
            print(f"  skipped: {e}", flush=True)
    report = {
        "machine": f"{platform.node()} {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
        "calls": args.calls,
        "note": "CPUs shared with other jobs during the run: treat absolute numbers as rough",
        "results": results,
        "skipped": skipped,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sandbox_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, RESULTS / "sandbox_bench.md")
    print((RESULTS / "sandbox_bench.md").read_text())


if __name__ == "__main__":
    asyncio.run(main())
