"""Peak memory of one learner step on CPU, measured in a fresh process: the CPU stand-in for
torch.cuda.max_memory_allocated.

    python benchmarks/_cpu_peak.py < cases.json      (what `measure` runs; prints one JSON line per case)

How, and why it is a fair stand-in. The child process starts with glibc's mmap threshold fixed at 64 KiB
(`MALLOC_MMAP_THRESHOLD_`), so every tensor above that is a mapping of its own, handed back to the kernel
the moment torch frees it: resident memory then follows the bytes of live tensors, as the CUDA caching
allocator's *allocated* count does (without the threshold glibc keeps freed heap pages and resident memory
stays at the high-water mark of everything ever allocated). For each case the child reads its resident set
size, builds the rank, runs one warm-up step (AdamW's moments exist from then on, as in every step after the
first), resets the kernel's high-water mark (`/proc/self/clear_refs` = 5), runs the measured step, and
reports VmHWM minus the resident size before the rank was built: weights, optimizer state and the step's
peak, like max_memory_allocated after reset_peak_memory_stats on a GPU holding only this learner. What it
counts that the GPU figure does not: the CPU kernels' scratch (oneDNN/OpenMP buffers, a few MiB) and small
allocations below 64 KiB; both are small next to the 100+ MiB the memory-model tests compare.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MMAP_THRESHOLD = 65536


def measure(
    cases: list[dict[str, Any]], *, threads: int = 2, timeout_s: float = 900.0
) -> list[dict[str, Any]]:
    """Run `cases` (each {"model_dir", "cell": Cell fields}) in one fresh child; one result dict per case."""
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "OMP_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, str(HERE / "_cpu_peak.py")],
        input=json.dumps({"threads": threads, "cases": cases}),
        stdout=subprocess.PIPE,  # results; the child's progress and errors go to our stderr
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory child failed (exit {proc.returncode}); its traceback is above")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_high_water_mark() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _one(case: dict[str, Any], primed: set[str]) -> dict[str, Any]:
    from _learner_bench import Cell, Rank, batch

    cell = Cell(**case["cell"])
    if cell.backend not in primed:  # imports, thread pools, lazy inits: theirs, not the step's
        primer = replace(cell, length=64, lora=False)
        rank = Rank(Path(case["model_dir"]), primer, "cpu")
        rank.step(batch(primer.rows, primer.length, rank.vocab))
        del rank
        primed.add(cell.backend)
    gc.collect()
    before = _status("VmRSS")
    rank = Rank(Path(case["model_dir"]), cell, "cpu")
    b = batch(cell.rows, cell.length, rank.vocab)
    rank.step(b)  # warm-up: AdamW's moments and lazy initialisations exist from here on
    gc.collect()
    _reset_high_water_mark()
    rank.step(b)
    peak = _status("VmHWM") - before
    del rank
    gc.collect()
    return {"cell": cell.as_dict(), "peak_bytes": peak, "rss_before_bytes": before}


def main() -> None:
    req = json.loads(sys.stdin.read())
    import torch

    torch.set_num_threads(int(req["threads"]))
    sys.path.insert(0, str(HERE))
    primed: set[str] = set()
    for case in req["cases"]:
        res = _one(case, primed)
        print(json.dumps(res), flush=True)
        print(
            f"  {res['cell']['name']}: peak {res['peak_bytes'] / 2**20:.0f} MiB", file=sys.stderr, flush=True
        )


if __name__ == "__main__":
    main()
