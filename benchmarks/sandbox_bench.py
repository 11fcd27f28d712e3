"""Sandbox throughput and latency: the local pool, the HTTP service, and the snippets models really run.

    .venv/bin/python benchmarks/sandbox_bench.py [--calls 2000] [--rounds 3] [--docker-host unix:///path/docker.sock]

All in one run, on the same machine state:
1. `print(1+1)` through the local pool (pool_size 2) with 2 and 8 concurrent callers: calls/s, p50, p99;
   the seccomp filter on and off, alternated over `--rounds` rounds (median and min-max), so its cost is
   read against the noise; `subprocess.run([python, "-c", code])` as the baseline.
2. The same through `agent-rl sandbox serve` (a separate process, pool_size 2) with 8 and 64 concurrent
   HTTP clients (aiohttp, SandboxFusion `/run_code`): calls/s, p50, p99.
3. A realistic snippet mix of model-written code (numpy, sympy, fractions, pure Python), with and without
   `preload: [numpy, sympy]` (what the math envs now declare): p50/p99 per snippet kind.
4. docker (warm containers) when `--docker-host` is given.
Writes benchmarks/results/sandbox_bench.{json,md} with benchmarks/harness (provenance under `meta`, medians and
ranges by `stats.spread`, each local round kept under its row's `runs`, one writer); `--from-results FILE` rewrites
the page from a results file, `--quick` is a machinery check (results under runs/bench unless --out).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import bench_paths  # noqa: F401  (puts the checkout on sys.path)

import sandboxes
from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import quick_args, results_args, results_dir, rewrite, write
from benchmarks.harness.stats import spread

PRINT = ("print(1+1)", "2\n")
# What models write in SimpleTIR math episodes: the kinds and a typical cell of each.
MIX = {
    "numpy": (
        "import numpy as np\nA = np.array([[2, 1], [1, 3]])\nprint(np.linalg.det(A).round(6), np.arange(10).sum())",
        "5.0 45\n",
    ),
    "sympy": (
        "from sympy import symbols, solve, Rational\nx = symbols('x')\nprint(solve(x**2 - 5*x + 6, x), Rational(3, 4) + Rational(1, 6))",
        "[2, 3] 11/12\n",
    ),
    "fractions": (
        "from fractions import Fraction\nfrom math import comb\nprint(sum(Fraction(1, k) for k in range(1, 11)), comb(10, 3))",
        "7381/2520 120\n",
    ),
    "pure": (
        "total = 0\nfor i in range(1, 1001):\n    if i % 3 == 0 or i % 5 == 0:\n        total += i\nprint(total)",
        "234168\n",
    ),
}
PRELOAD = ("numpy", "sympy")


def quantiles(latencies: list[float]) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3}


async def measure(
    call: Callable[[str], Awaitable[str]], code: str, expect: str, calls: int, conc: int
) -> dict:
    for _ in range(3):  # warm up
        got = await call(code)
        assert got == expect, got
    latencies: list[float] = []
    left = [calls]

    async def caller() -> None:
        while left[0] > 0:
            left[0] -= 1
            t0 = time.perf_counter()
            out = await call(code)
            latencies.append(time.perf_counter() - t0)
            assert out == expect, out

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(conc)))
    wall = time.perf_counter() - start
    return {
        **quantiles(latencies),
        "calls_per_s": len(latencies) / wall,
        "n": len(latencies),
        "callers": conc,
    }


def sandbox_call(sb: sandboxes.Sandbox) -> Callable[[str], Awaitable[str]]:
    async def call(code: str) -> str:
        result = await sb.run(code, limits=sandboxes.Limits(timeout_s=60))
        return result.stdout if result.exit_code == 0 else f"{result}"

    return call


async def subprocess_call(code: str) -> str:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode()


async def bench_local_print(calls: int, rounds: int) -> dict:
    """seccomp on/off alternated per round; each round measures 2 and 8 callers."""
    rows: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for seccomp in (True, False):
            async with sandboxes.create("local", pool_size=2, seccomp=seccomp) as sb:
                await sb.start()
                for conc in (2, 8):
                    row = await measure(sandbox_call(sb), *PRINT, calls, conc)
                    rows.setdefault(f"seccomp={'on' if seccomp else 'off'}/c{conc}", []).append(row)
                    print(f"  local print seccomp={seccomp} c={conc}: {row}", flush=True)
    return {key: summarize(runs) for key, runs in rows.items()}


def summarize(runs: list[dict]) -> dict:
    """Median and range over the rounds of each figure (stats.spread), the rounds themselves under `runs`."""
    out: dict = {"rounds": len(runs)}
    for field in ("calls_per_s", "p50_ms", "p99_ms"):
        s = spread(r[field] for r in runs)
        out[field], out[f"{field}_min"], out[f"{field}_max"] = s["median"], s["min"], s["max"]
    return out | {"runs": runs}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def bench_http(calls: int) -> dict:
    import aiohttp

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "sandboxes", "serve", "--pool-size", "2", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    rows = {}
    try:
        assert server.stdout is not None and "sandbox service" in server.stdout.readline()
        url = f"http://127.0.0.1:{port}/run_code"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def call(code: str) -> str:
                async with http.post(url, json={"code": code, "language": "python"}) as resp:
                    body = await resp.json()
                return body["run_result"]["stdout"]

            for conc in (8, 64):
                rows[f"c{conc}"] = await measure(call, *PRINT, calls, conc)
                print(f"  http print c={conc}: {rows[f'c{conc}']}", flush=True)
    finally:
        server.terminate()
        server.wait(30)
    return rows


async def bench_mix(calls: int) -> dict:
    rows: dict[str, dict] = {}
    for preload in ((), PRELOAD):
        name = "preload numpy,sympy" if preload else "no preload"
        async with sandboxes.create("local", pool_size=2, preload=list(preload)) as sb:
            await sb.start()
            for kind, (code, expect) in MIX.items():
                row = await measure(sandbox_call(sb), code, expect, calls, 2)
                rows[f"{name}/{kind}"] = row
                print(f"  mix {name} {kind}: {row}", flush=True)
    return rows


async def bench_docker(calls: int, docker_host: str) -> dict:
    rows = {}
    async with sandboxes.create("docker", pool_size=2, docker_host=docker_host) as sb:
        await sb.start()
        for conc in (2, 8):
            rows[f"c{conc}"] = await measure(sandbox_call(sb), *PRINT, calls, conc)
            print(f"  docker print c={conc}: {rows[f'c{conc}']}", flush=True)
    return rows


def markdown(report: dict) -> str:
    r = report["results"]
    base = r["subprocess.run (baseline)"]
    meta = report.get("meta")  # before the harness: its own command, machine and load fields
    when = describe(meta) if meta else f"{report['machine']}; load average at start {report['loadavg_start']}"
    lines = [
        "# Sandbox benchmark",
        "",
        f"`{meta['command'] if meta else report['command']}`",
        "",
        f"{when}; {report['calls']} calls per cell (the snippet mix: {report['mix_calls']}).",
        "",
        "## print(1+1): local pool (pool_size 2) and the HTTP service, same run",
        "",
        f"Local rows: median over {report['rounds']} rounds, seccomp on and off alternated (min-max in brackets).",
        "",
        "| path | callers | calls/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
        f"| subprocess.run (baseline) | 2 | {base['calls_per_s']:.0f} | {base['p50_ms']:.2f} | {base['p99_ms']:.2f} |",
    ]
    for key, row in r["local"].items():
        mode, conc = key.split("/")
        lines.append(
            f"| local, {mode} | {conc[1:]} | {row['calls_per_s']:.0f} ({row['calls_per_s_min']:.0f}-"
            f"{row['calls_per_s_max']:.0f}) | {row['p50_ms']:.2f} ({row['p50_ms_min']:.2f}-{row['p50_ms_max']:.2f}) | "
            f"{row['p99_ms']:.2f} |"
        )
    for key, row in r["http"].items():
        lines.append(
            f"| HTTP `sandbox serve` /run_code | {key[1:]} | {row['calls_per_s']:.0f} | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} |"
        )
    for key, row in r.get("docker", {}).items():
        lines.append(
            f"| docker | {key[1:]} | {row['calls_per_s']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |"
        )
    lines += [
        "",
        "## The snippet mix (2 callers, pool_size 2)",
        "",
        "| snippet | no preload p50 / p99 ms | preload numpy,sympy p50 / p99 ms | p50 speed-up |",
        "|---|---|---|---|",
    ]
    for kind in MIX:
        a, b = r["mix"][f"no preload/{kind}"], r["mix"][f"preload numpy,sympy/{kind}"]
        lines.append(
            f"| {kind} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} | "
            f"{a['p50_ms'] / b['p50_ms']:.1f}x |"
        )
    lines += [
        "",
        f"Goal (issue 15): >= 700 print(1+1) calls/s through the local pool on 2 cores. {report['verdict']}",
    ]
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items())]
    return "\n".join(lines) + "\n"


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--mix-calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docker-host", default=None)
    results_args(parser, "sandbox_bench")
    quick_args(parser, calls=40, mix_calls=10, rounds=1)
    args = parser.parse_args(argv)
    if rewrite(args, "sandbox_bench", markdown):
        return
    prov = Provenance()
    results: dict = {}
    skipped: dict = {}
    print("subprocess.run baseline:", flush=True)
    results["subprocess.run (baseline)"] = await measure(
        subprocess_call, *PRINT, max(50, args.calls // 20), 2
    )
    print("local print:", flush=True)
    results["local"] = await bench_local_print(args.calls, args.rounds)
    print("http print:", flush=True)
    results["http"] = await bench_http(args.calls)
    print("snippet mix:", flush=True)
    results["mix"] = await bench_mix(args.mix_calls)
    if args.docker_host:
        try:
            results["docker"] = await bench_docker(args.calls, args.docker_host)
        except sandboxes.SandboxError as e:
            skipped["docker"] = str(e)
    best = max(row["calls_per_s"] for key, row in results["local"].items() if key.startswith("seccomp=on"))
    verdict = (
        f"Reached: {best:.0f} calls/s with the filter on."
        if best >= 700
        else f"Not reached: {best:.0f} calls/s."
    )
    report = {
        "meta": prov.meta(),
        "calls": args.calls,
        "mix_calls": args.mix_calls,
        "rounds": args.rounds,
        "results": results,
        "skipped": skipped,
        "verdict": verdict,
    }
    write("sandbox_bench", report, results_dir(args.out, scratch=args.quick, name="sandbox_bench"), markdown)


if __name__ == "__main__":
    asyncio.run(main())
