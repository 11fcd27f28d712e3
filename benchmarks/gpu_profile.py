"""Where the learners' steps go against the anchor's: one profiled step per cell, device time by kernel kind.

On a GPU machine (the same setup as benchmarks/gpu_learners.py: wheels/ installed into /tmp/site):

    PYTHONPATH=/tmp/site:. python benchmarks/gpu_profile.py            # -> benchmarks/results/gpu_profile.{json,md}
    python benchmarks/gpu_profile.py --cpu-smoke                        # tiny shapes on CPU (tests/benchmarks runs it)

gpu_learners.py measures the torch learner's tokens/s against the anchor's (transformers + SDPA + Liger, same
batch), exact OPOB against proxy and Megatron against the torch learner; it does not say why. This runs the
cells that carry those gaps (PROFILED, built by gpu_learners' own code: the same recipe, ranks, batches and anchor) under
`torch.profiler`: one warm-up step, one unprofiled timed step, one profiled step. Per cell it writes the step's
wall time, the summed device (kernel) time and its share of the wall (a low share: the GPU waits on the host,
launch- or sync-bound), device time by kernel kind (KINDS: matmul, attention, the loss head, elementwise and
reductions, the optimizer, copies), the top kernels, and the host's synchronizations with the device
(SYNC_CALLS: how many, and the host time spent waiting in them). On CPU the "device" is the CPU's self time per
op and there are no synchronizations.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _learner_bench import QWEN25_05B, SMALL, Cell, Rank, batch, sync, write_model  # noqa: E402
from gpu_learners import MICRO_BATCH_TOKENS, Anchor, _f, free, git_commit, versions  # noqa: E402

from agent_rl.checkpoint import write_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
M = MICRO_BATCH_TOKENS
PROFILED = (  # the gaps gpu_learners.json reports: proxy vs anchor at 8 x 4096 and 2 x 32768, exact vs proxy,
    # Megatron vs the torch learner (exact OPOB both); the first five first, as a run cut at its limit keeps them
    Cell("anchor", 4096, 8, micro_batch_tokens=M), Cell("torch", 4096, 8, opob="proxy", micro_batch_tokens=M),
    Cell("torch", 4096, 8, micro_batch_tokens=M),
    Cell("anchor", 32768, 2, recompute=True, micro_batch_tokens=M),
    Cell("torch", 32768, 2, opob="proxy", recompute=True, micro_batch_tokens=M),
    Cell("megatron", 4096, 8, micro_batch_tokens=M),
    Cell("megatron", 32768, 2, recompute=True, micro_batch_tokens=M),
)  # fmt: skip
# The CUDA runtime calls that block the host until the device has finished its queue (an item(), a .cpu(), a
# boolean-mask index, an explicit synchronize): the profiler files them as host events. A step that makes many
# leaves the device idle while the host catches up (the busy share). The step's own closing synchronize
# (profile_step's sync) is one cudaDeviceSynchronize among them.
SYNC_CALLS = re.compile(r"^cuda(Stream|Device|Event)Synchronize$")
# Kernel kind by name, first match wins (CUDA kernel names: cuBLAS/CUTLASS gemms, flash/efficient attention,
# Liger's Triton kernels, ATen's elementwise and reduction templates; on CPU the aten op names).
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.I))
    for kind, pattern in (
        ("attention", r"flash|fmha|attention|sdpa|attn"),
        ("optimizer", r"adam|multi_tensor|foreach"),
        ("loss head", r"cross_entropy|log_softmax|logsumexp|softmax|liger|gather|nll"),
        ("matmul", r"gemm|matmul|\bmm\b|aten::mm|addmm|bmm|cutlass|xmma|sm90_|sm80_|linear"),
        ("copies", r"copy|memcpy|memset|cast|\bto\b|cat|fill"),
        (
            "elementwise / reduce",
            r"elementwise|reduce|vectorized|unrolled|mul|add|silu|rsqrt|pow|mean|sum|norm",
        ),
    )
)


def kind_of(name: str) -> str:
    return next((kind for kind, rx in KINDS if rx.search(name)), "other")


def profile_step(step, device: str) -> dict[str, Any]:
    """One warm-up step, one timed step, one profiled step: wall times, device time by kind, the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    step()
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    wall = time.perf_counter() - t0
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        step()
        sync(device)
        profiled_wall = time.perf_counter() - t0
    events = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None) if cuda else e.self_cpu_time_total
        if us is None:  # torch < 2.4 names it per backend
            us = e.self_cuda_time_total
        if us > 0 and (not cuda or e.device_type.name == "CUDA" or "cuda" in str(e.device_type).lower()):
            events.append((e.key, us / 1e6, e.count))
    if cuda and not events:  # a torch that files kernels under the CPU op: take every op with device time
        events = [
            (e.key, e.self_device_time_total / 1e6, e.count)
            for e in prof.key_averages()
            if e.self_device_time_total > 0
        ]
    syncs = {
        e.key: {"calls": e.count, "host_s": e.self_cpu_time_total / 1e6}
        for e in prof.key_averages()
        if SYNC_CALLS.match(e.key)
    }
    busy = sum(s for _, s, _ in events)
    by_kind: dict[str, float] = {}
    for name, s, _ in events:
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + s
    top = sorted(events, key=lambda x: -x[1])[:12]
    return {
        "wall_s": wall, "profiled_wall_s": profiled_wall, "device_busy_s": busy,
        "busy_share": busy / profiled_wall if profiled_wall else None,
        "by_kind_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "top": [{"kernel": n[:160], "s": s, "calls": c, "kind": kind_of(n)} for n, s, c in top],
        "syncs": syncs, "sync_calls": sum(v["calls"] for v in syncs.values()),
        "sync_host_s": sum(v["host_s"] for v in syncs.values()),
    }  # fmt: skip


def run(args: argparse.Namespace, keep=lambda res: None) -> dict[str, Any]:
    """Every cell of PROFILED; `keep` sees the results after each cell, the cells not reached yet marked not_run
    (the run writes them: one cut at its time limit keeps the cells it profiled)."""
    device = "cpu" if args.cpu_smoke else args.device
    cells = (
        [replace(c, length=64, rows=4, micro_batch_tokens=128) for c in PROFILED]
        if args.cpu_smoke
        else list(PROFILED)
    )
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": args.commit or git_commit(),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else f"cpu ({platform.processor() or platform.machine()})",
        "versions": versions(), "shape": "small (cpu smoke)" if args.cpu_smoke else "Qwen2.5-0.5B (random init)",
    }  # fmt: skip
    rows = []
    liger = device.startswith("cuda") and not args.no_liger
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp) / "m", SMALL if args.cpu_smoke else QWEN25_05B, device=device)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        for cell in cells:
            print(f"profiling {cell.name}", flush=True)
            b = batch(cell.rows, cell.length, vocab, device=device)
            runner = None
            try:
                runner = (
                    Anchor(model, cell, device, liger=liger)
                    if cell.backend == "anchor"
                    else Rank(model, cell, device)
                )
                row = (
                    cell.as_dict() | {"status": "ok"} | profile_step(lambda r=runner, b=b: r.step(b), device)
                )
            except Exception as e:  # noqa: BLE001 - one cell's failure is that cell's result
                row = cell.as_dict() | {
                    "status": "error",
                    "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                }
            finally:
                runner = None
                free(device)
            rows.append(row)
            later = [
                c.as_dict() | {"status": "not_run", "reason": "not reached yet"} for c in cells[len(rows) :]
            ]
            keep({"meta": meta | {"liger": liger}, "cells": rows + later})
            print(
                f"  -> {row['status']} {row.get('wall_s', '')} busy {row.get('busy_share', '')}", flush=True
            )
    return {"meta": meta | {"liger": liger}, "cells": rows}


def markdown(res: dict[str, Any]) -> str:
    m, ok = res["meta"], [r for r in res["cells"] if r["status"] == "ok"]
    kinds = [k for k, _ in KINDS] + ["other"]
    lines = [
        "# Where a learner step goes: one profiled step per cell (benchmarks/gpu_profile.py)", "",
        f"{m['date']}, commit {m['commit']}, {m['device']}; {m['shape']}; versions {json.dumps(m['versions'])}; "
        f"anchor {'with' if m['liger'] else 'without'} Liger. Seconds of device time per step by kernel kind; "
        "busy = summed kernel time / the profiled step's wall time (below 1: the device waits on the host). "
        "syncs: CUDA runtime calls in the profiled step that block the host until the device's queue is done "
        "(cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize; the step's closing synchronize is "
        "one), and the host seconds spent in them.", "",
        "| cell | step s | profiled s | busy | syncs | sync wait s | " + " | ".join(kinds) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(kinds),
    ]  # fmt: skip
    for r in ok:
        lines.append(
            f"| {r['name']} | {r['wall_s']:.3f} | {r['profiled_wall_s']:.3f} | {r['busy_share']:.2f} | "
            f"{r.get('sync_calls', '')} | {_f(r.get('sync_host_s'), '.3f')} | "
            + " | ".join(f"{r['by_kind_s'].get(k, 0.0):.3f}" for k in kinds)
            + " |"
        )
    for r in res["cells"]:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']}: {r['reason']} |")
    for r in ok:
        lines += [
            "",
            f"## {r['name']}: top kernels",
            "",
            "| kernel | kind | calls | s |",
            "|---|---|---|---|",
        ]
        lines += [f"| `{t['kernel'][:100]}` | {t['kind']} | {t['calls']} | {t['s']:.4f} |" for t in r["top"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny shapes on CPU (the code path, not the numbers)"
    )
    ap.add_argument("--no-liger", action="store_true", help="the anchor without Liger (plain cross-entropy)")
    ap.add_argument(
        "--commit", help="the commit measured (default: git rev-parse; the GPU machine has no .git)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    stem = "gpu_profile_smoke" if args.cpu_smoke else "gpu_profile"
    args.out.mkdir(parents=True, exist_ok=True)

    def write(res: dict[str, Any]) -> None:  # each file whole or not at all: a kill may come mid-write
        write_atomic(args.out / f"{stem}.json", json.dumps(res, indent=2) + "\n")
        write_atomic(args.out / f"{stem}.md", markdown(res))

    res = run(args, keep=write)
    write(res)
    print(f"wrote {args.out / stem}.json and .md", flush=True)
    return 1 if any(r["status"] != "ok" for r in res["cells"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
