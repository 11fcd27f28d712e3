"""Peak memory of one learner step on CPU, measured in a fresh process: the CPU stand-in for
torch.cuda.max_memory_allocated.

    python benchmarks/_cpu_peak.py < cases.json      (what `measure` runs; prints one JSON line per case)

Each case: build the rank, one warm-up step (AdamW's moments exist from then on, as in every step after the
first), then the measured step; `peak_bytes` is the peak over the measured step less what the process held
before the rank was built (weights, optimizer state and the step's peak, like max_memory_allocated after
reset_peak_memory_stats on a GPU holding only this learner). Two counters, each in a child of its own:

- "tensors": the bytes of live tensors, counted by torch's CPU allocator while the profiler records memory
  (from before the rank is built, so every allocation carries its size; the peak is the largest running total
  during the measured step), plus the model's parameters that the allocator never handed out (weights loaded
  from safetensors stay mapped from the file on CPU; a GPU copies them into allocated memory). This is what
  max_memory_allocated counts on a GPU and what the memory model estimates: the memory-model tests compare it.
  Hand-written over the profiler's event tree because torch (2.13) keeps no allocator statistics on CPU: the
  profiler's allocation events, each with the allocator's running total, are the one count there is.
- "resident": the kernel's high-water mark of resident memory (VmHWM, reset through `/proc/self/clear_refs`).
  The child starts with glibc's mmap threshold fixed at 64 KiB (`MALLOC_MMAP_THRESHOLD_`), so every tensor above
  that is a mapping of its own, handed back to the kernel the moment torch frees it, and resident memory
  follows live tensors. It also counts what is not a tensor: the CPU kernels' scratch, the autograd graph and
  other small allocations, thread stacks, malloc arenas. On a tiny model that part is not small, and it varies
  with the environment: Megatron's bf16 8192-token step of the SMALL shape peaks at 62 MiB of tensors and
  73-87 MiB resident (2026-11-27, alone and inside make test-heavy). The CPU table reports it, as what a CPU
  user's process takes.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch

HERE = Path(__file__).resolve().parent
MMAP_THRESHOLD = 65536


Counter = Literal["tensors", "resident"]


def measure(
    cases: list[dict[str, Any]], *, counter: Counter = "resident", threads: int = 2, timeout_s: float = 900.0
) -> list[dict[str, Any]]:
    """Run `cases` (each {"model_dir", "cell": Cell fields}) in one fresh child; one result dict per case, its
    `peak_bytes` by `counter` (see the module docstring)."""
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "OMP_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, str(HERE / "_cpu_peak.py")],
        input=json.dumps({"threads": threads, "counter": counter, "cases": cases}),
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


def _one(case: dict[str, Any], counter: Counter, primed: set[str]) -> dict[str, Any]:
    from _learner_bench import Cell, Rank, batch

    cell = Cell(**case["cell"])
    if cell.backend not in primed:  # imports, thread pools, lazy inits: theirs, not the step's
        primer = replace(cell, length=64, lora=False)
        rank = Rank(Path(case["model_dir"]), primer, "cpu")
        rank.step(batch(primer.rows, primer.length, rank.vocab))
        del rank
        primed.add(cell.backend)
    gc.collect()
    profiler = None
    if counter == "tensors":
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        )
    with profiler or contextlib.nullcontext():
        before = _status("VmRSS")
        rank = Rank(Path(case["model_dir"]), cell, "cpu")
        b = batch(cell.rows, cell.length, rank.vocab)
        rank.step(b)  # warm-up: AdamW's moments and lazy initialisations exist from here on
        gc.collect()
        _reset_high_water_mark()
        with torch.profiler.record_function(MEASURED):
            rank.step(b)
        resident = _status("VmHWM") - before
    peak = resident if profiler is None else tensor_peak(profiler, rank.model)
    del rank
    gc.collect()
    return {"cell": cell.as_dict(), "counter": counter, "peak_bytes": peak, "rss_before_bytes": before}


MEASURED = "cpu_peak.measured_step"


def tensor_peak(prof: torch.profiler.profile, model: torch.nn.Module) -> int:
    """Largest total of live tensor bytes during the MEASURED range, less the total when profiling began, plus
    the bytes of `model`'s parameters and buffers that the allocator never handed out: weights loaded from
    safetensors stay mapped from the file (on a GPU they are copied into allocated memory)."""
    events = []  # (time ns, bytes allocated (+) or freed (-), allocator's running total after it, address)
    window = None
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        if e.name == MEASURED:
            window = (e.start_time_ns, e.end_time_ns)
        fields = e.extra_fields
        if isinstance(fields, torch._C._profiler._ExtraFields_Allocation) and fields.device.type == "cpu":
            events.append((e.start_time_ns, fields.alloc_size, fields.total_allocated, fields.ptr))
    if window is None or not events:
        raise RuntimeError(
            "the profiler recorded no measured step or no allocation: torch's profiler changed?"
        )
    events.sort()
    start = events[0][2] - events[0][1]
    inside = [total for t, _, total, _ in events if window[0] <= t <= window[1]]
    entering = [total for t, _, total, _ in events if t < window[0]]
    allocated: set[int] = set()
    for _, size, _, ptr in events:
        (allocated.add if size > 0 else allocated.discard)(ptr)
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in (*model.parameters(), *model.buffers())
    }
    mapped = sum(n for ptr, n in storages.items() if ptr not in allocated)
    return max(inside + entering[-1:]) - start + mapped


def main() -> None:
    req = json.loads(sys.stdin.read())
    torch.set_num_threads(int(req["threads"]))
    sys.path.insert(0, str(HERE))
    primed: set[str] = set()
    for case in req["cases"]:
        res = _one(case, req["counter"], primed)
        print(json.dumps(res), flush=True)
        print(
            f"  {res['cell']['name']}: peak {res['peak_bytes'] / 2**20:.0f} MiB ({res['counter']})",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    main()
