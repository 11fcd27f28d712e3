"""The CPU memory table (`gpu_learners.py --cpu-memory`): peak memory of one step of each learner on a tiny
shape, 1k to 16k tokens per trajectory, measured in a fresh process (_cpu_peak.py), with the memory model's
estimate beside each measured peak. Growth per doubling of the length tells linear (x2) from quadratic (x4).

Results accumulate in benchmarks/results/learner_memory_cpu.json, one run per commit (a rerun on the same
commit replaces its own), so the table before and after a learner change stand side by side.
"""

from __future__ import annotations

import datetime
import json
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _cpu_peak import measure
from _learner_bench import CPU_TABLE, Cell, write_model

LENGTHS = (1024, 2048, 4096, 8192, 16384)
LIMIT_BYTES = (
    8 * 2**30
)  # this machine is shared (24 GiB, several engineers): a cell estimated above is skipped
STEM = "learner_memory_cpu"


def run_table(
    out: Path, *, commit: str, lengths: tuple[int, ...] = LENGTHS, limit: int = LIMIT_BYTES
) -> dict:
    from gpu_learners import setup_for

    from agent_rl.learners import memory as mm

    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / "model", CPU_TABLE)
        dims = mm.ModelDims.from_model_dir(model_dir)
        for backend in ("torch", "megatron"):
            cases, planned = [], []
            for length in lengths:
                cell = Cell(backend, length, 2, dtype="float32", repeats=1)  # type: ignore[arg-type]
                est = mm.step_memory(dims, setup_for(cell, "cpu"), length)
                row = {"backend": backend, "length": length, "estimate_mib": est.total / 2**20,
                       "estimate_terms": {t.name: t.bytes / 2**20 for t in est.terms}}  # fmt: skip
                if est.total > limit:
                    row |= {
                        "status": "skipped",
                        "reason": f"memory model: {est.describe()} > {limit / 2**30:.0f} GiB limit",
                    }
                else:
                    cases.append({"model_dir": str(model_dir), "cell": _fields(cell)})
                    planned.append(row)
                rows.append(row)
            print(
                f"[{time.monotonic() - start:6.1f} s] {backend}: measuring {[r['length'] for r in planned]}",
                flush=True,
            )
            for row, res in zip(planned, measure(cases), strict=True):
                row |= {"status": "ok", "peak_mib": res["peak_bytes"] / 2**20}
                row["estimate_over_measured"] = row["estimate_mib"] / row["peak_mib"]
    for backend in ("torch", "megatron"):
        prev = None
        for row in (r for r in rows if r["backend"] == backend):
            if row.get("status") == "ok" and prev is not None and prev.get("status") == "ok":
                row["growth_per_doubling"] = row["peak_mib"] / prev["peak_mib"]
            prev = row
    run = {
        "commit": commit, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor()}, 2 torch threads", "shape": CPU_TABLE,
        "params": dims.params, "batch": "2 trajectories (one group, rewards 1/0), vcpo + exact OPOB, fp32",
        "elapsed_s": time.monotonic() - start, "rows": rows,
    }  # fmt: skip
    path = out / f"{STEM}.json"
    runs = [
        r for r in (json.loads(path.read_text())["runs"] if path.exists() else []) if r["commit"] != commit
    ]
    res = {"runs": [*runs, run]}
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{STEM}.md").write_text(markdown(res))
    print(f"wrote {path} and .md", flush=True)
    return res


def _fields(cell: Cell) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(replace(cell))


def markdown(res: dict) -> str:
    lines = [
        "# Peak memory of one learner step on CPU, 1k-16k tokens per trajectory (gpu_learners.py --cpu-memory)", "",
        "Measured: VmHWM of a fresh process (glibc mmap threshold 64 KiB, so freed tensors leave resident memory) "
        "minus its resident size before the rank was built, over the second step (benchmarks/_cpu_peak.py). "
        "Estimate: agent_rl/learners/memory.py. Growth per doubling of the length: ~2 linear, ~4 quadratic.", "",
    ]  # fmt: skip
    for run in res["runs"]:
        s = run["shape"]
        lines += [
            f"## commit {run['commit']} ({run['date']})", "",
            f"Shape: hidden {s['hidden_size']}, {s['num_hidden_layers']} layers, {s['num_attention_heads']} heads / "
            f"{s['num_key_value_heads']} KV, ffn {s['intermediate_size']}, vocab {s['vocab_size']} ({run['params'] / 1e6:.2f}M "
            f"params); {run['batch']}; {run['machine']}.", "",
            "| learner | tokens | measured MiB | estimate MiB | estimate / measured | growth per doubling | note |",
            "|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for r in run["rows"]:
            lines.append(
                f"| {r['backend']} | {r['length']} | {_f(r.get('peak_mib'), ',.0f')} | {r['estimate_mib']:,.0f} | "
                f"{_f(r.get('estimate_over_measured'), '.2f')} | {_f(r.get('growth_per_doubling'), '.2f')} | {r.get('reason', '')} |"
            )
        lines.append("")
    return "\n".join(lines)


def _f(x: Any, fmt: str) -> str:
    return "" if x is None else format(x, fmt)
