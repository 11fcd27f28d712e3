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
    out: Path,
    *,
    commit: str,
    lengths: tuple[int, ...] = LENGTHS,
    backends: tuple[str, ...] = ("torch", "megatron"),
    limit: int = LIMIT_BYTES,
) -> dict:
    """Measure every (learner, length) cell of `commit` not yet in the results file, each in a fresh process,
    saving after each: an interrupted run continues where it stopped when started again on the same commit."""
    from gpu_learners import setup_for

    from agent_rl.learners import memory as mm

    path = out / f"{STEM}.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    run = next((r for r in runs if r["commit"] == commit), None)
    if run is None:
        run = {"commit": commit, "rows": []}
        runs.append(run)
    done = {(r["backend"], r["length"]) for r in run["rows"] if r.get("status") in ("ok", "skipped")}
    run["rows"] = [r for r in run["rows"] if (r["backend"], r["length"]) in done]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / "model", CPU_TABLE)
        dims = mm.ModelDims.from_model_dir(model_dir)
        run |= {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "shape": CPU_TABLE,
            "machine": f"{platform.machine()} {platform.processor()}, 2 torch threads", "params": dims.params,
            "batch": "2 trajectories (one group, rewards 1/0), vcpo + exact OPOB, fp32",
        }  # fmt: skip
        for backend in backends:
            for length in lengths:
                if (backend, length) in done:
                    continue
                cell = Cell(backend, length, 2, dtype="float32", repeats=1)  # type: ignore[arg-type]
                est = mm.step_memory(dims, setup_for(cell, "cpu", dims), length)
                row = {"backend": backend, "length": length, "estimate_mib": est.total / 2**20,
                       "estimate_terms": {t.name: t.bytes / 2**20 for t in est.terms}}  # fmt: skip
                if est.total > limit:
                    row |= {
                        "status": "skipped",
                        "reason": f"memory model: {est.describe()} > {limit / 2**30:.0f} GiB limit",
                    }
                else:
                    print(f"[{time.monotonic() - start:6.1f} s] {backend} {length} tokens", flush=True)
                    (res,) = measure(
                        [{"model_dir": str(model_dir), "cell": _fields(cell)}], timeout_s=4 * 3600
                    )
                    row |= {"status": "ok", "peak_mib": res["peak_bytes"] / 2**20}
                    row["estimate_over_measured"] = row["estimate_mib"] / row["peak_mib"]
                run["rows"].append(row)
                _save(out, runs)
        for row in run["rows"]:  # every row's estimate from this memory model (a rerun refreshes them)
            cell = Cell(row["backend"], row["length"], 2, dtype="float32", repeats=1)
            est = mm.step_memory(dims, setup_for(cell, "cpu", dims), row["length"])
            row |= {
                "estimate_mib": est.total / 2**20,
                "estimate_terms": {t.name: t.bytes / 2**20 for t in est.terms},
            }
            if row.get("status") == "ok":
                row["estimate_over_measured"] = row["estimate_mib"] / row["peak_mib"]
            elif row.get("status") == "skipped":
                row["reason"] = f"memory model: {est.describe()} > {limit / 2**30:.0f} GiB limit"
    run["rows"].sort(key=lambda r: (r["backend"] != "torch", r["length"]))
    _save(out, runs)
    print(f"wrote {path} and .md", flush=True)
    return {"runs": runs}


def _save(out: Path, runs: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    (out / f"{STEM}.md").write_text(markdown({"runs": runs}))


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
        ok = {(r["backend"], r["length"]): r["peak_mib"] for r in run["rows"] if r.get("status") == "ok"}
        for r in run["rows"]:
            growth = (
                ok.get((r["backend"], r["length"]), 0) / ok[(r["backend"], r["length"] // 2)]
                if ((r["backend"], r["length"]) in ok and (r["backend"], r["length"] // 2) in ok)
                else None
            )
            lines.append(
                f"| {r['backend']} | {r['length']} | {_f(r.get('peak_mib'), ',.0f')} | {r['estimate_mib']:,.0f} | "
                f"{_f(r.get('estimate_over_measured'), '.2f')} | {_f(growth, '.2f')} | {r.get('reason', '')} |"
            )
        lines.append("")
    return "\n".join(lines)


def _f(x: Any, fmt: str) -> str:
    return "" if x is None else format(x, fmt)
