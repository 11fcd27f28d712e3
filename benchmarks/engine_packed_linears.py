"""The embedded engine's fused linears on oneDNN's prepacked weights vs MKL's `x @ W`, on SmolLM2-135M (issue 62).

    .venv/bin/python benchmarks/engine_packed_linears.py [--smollm2-dir runs/smollm2] [--threads 1] [--repeats 3]

One engine (the scheduler driven in this process, greedy, EOS ignored), the same prompts (lengths 8-64) and 48 new
tokens each, batches 16 and 64: every fused linear packed (agent_rl/engines/embedded/fused.py, what the engine
does) against every one on plain `x @ W` (the engine before issue 62), the two interleaved per repeat. The figure
is CPU seconds of this process per useful token (steady on a shared machine), with wall time beside it; ratios
within this run. Results: benchmarks/results/engine_packed_linears.{json,md} (--out to write elsewhere).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.provenance import Provenance  # noqa: E402
from benchmarks.harness.report import table, write  # noqa: E402


def fused_linears(model) -> list:
    from agent_rl.engines.embedded.fused import Fused

    return [v for m in model.modules() for v in vars(m).values() if isinstance(v, Fused)]


def run(sched, batch: int, new_tokens: int, tag: str, seed: int) -> tuple[float, float, int]:
    from agent_rl.engines.api import SamplingParams
    from agent_rl.engines.embedded.scheduler import Request

    rng = random.Random(seed)
    vocab = sched.model.cfg.vocab_size
    for i in range(batch):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 64))]
        sp = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
        sched.add(Request(f"{tag}{i}", prompt, sp, lambda _o: None))
    t0, c0 = time.perf_counter(), time.process_time()
    while sched.has_work():
        sched.step()
    return time.perf_counter() - t0, time.process_time() - c0, batch * new_tokens


def markdown(out: dict) -> str:
    lines = [
        "# Embedded engine: fused linears on prepacked oneDNN weights vs MKL `x @ W` (SmolLM2-135M)",
        "",
        f"`{out['command']}`, {out['date']}; {out['machine']}. {out['threads']} torch thread(s), fp32, greedy, "
        f"{out['new_tokens']} new tokens per request, prompts 8-64 tokens, {out['repeats']} interleaved repeats "
        "(median). CPU s per token: this process's CPU seconds per useful output token.",
        "",
    ]
    rows = [
        [
            r["batch"],
            f"{r['plain']['cpu_ms_per_token']:.2f}",
            f"{r['packed']['cpu_ms_per_token']:.2f}",
            f"{r['speedup_cpu']:.2f}x",
            f"{r['plain']['tok_s']:.1f}",
            f"{r['packed']['tok_s']:.1f}",
            f"{r['speedup_wall']:.2f}x",
        ]
        for r in out["rows"]
    ]
    lines += table(
        [
            "batch",
            "plain CPU ms/token",
            "packed CPU ms/token",
            "packed faster (CPU)",
            "plain tok/s",
            "packed tok/s",
            "packed faster (wall)",
        ],
        rows,
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smollm2-dir", type=Path, default=ROOT / "runs" / "smollm2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", default="16,64")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    if not (args.smollm2_dir / "config.json").is_file():
        raise SystemExit(
            f"{args.smollm2_dir}: no SmolLM2 here; run `agent-rl prepare smollm2 --out {args.smollm2_dir}`"
        )
    import torch

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.scheduler import Scheduler

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    prov, load0 = Provenance(), os.getloadavg()
    sched = Scheduler(args.smollm2_dir, EngineOptions(max_batch=max(batches), max_seq_len=256), seed=0)
    linears = fused_linears(sched.model)
    packable = [f for f in linears if f.pack]
    run(sched, 4, 4, "warm", 0)

    def set_packed(on: bool) -> None:
        for f in packable:
            f.pack = on

    rows = []
    for b in batches:
        res: dict[str, list[tuple[float, float, int]]] = {"plain": [], "packed": []}
        for rep in range(args.repeats):
            for mode in ("plain", "packed") if rep % 2 == 0 else ("packed", "plain"):
                set_packed(mode == "packed")
                res[mode].append(run(sched, b, args.new_tokens, f"{mode}{b}r{rep}", seed=b * 100 + rep))
        row: dict = {"batch": b}
        for mode, rs in res.items():
            wall = statistics.median(r[0] for r in rs)
            cpu = statistics.median(r[1] for r in rs)
            n = rs[0][2]
            row[mode] = {"tok_s": n / wall, "cpu_ms_per_token": 1000 * cpu / n, "wall_s": [r[0] for r in rs],
                         "cpu_s": [r[1] for r in rs]}  # fmt: skip
        row["speedup_cpu"] = row["plain"]["cpu_ms_per_token"] / row["packed"]["cpu_ms_per_token"]
        row["speedup_wall"] = row["packed"]["tok_s"] / row["plain"]["tok_s"]
        print(row, flush=True)
        rows.append(row)
    set_packed(True)
    load1 = os.getloadavg()
    out = {
        "command": "benchmarks/engine_packed_linears.py " + " ".join(sys.argv[1:]).replace(f"{ROOT}/", ""),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} cores, load average {load0[0]:.1f} at start, {load1[0]:.1f} at the end "
        f"(other users' jobs included); ATEN_CPU_CAPABILITY {os.environ.get('ATEN_CPU_CAPABILITY', 'default')}",
        "meta": prov.meta(),
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "packed_linears": f"{len(packable)} of {len(linears)} fused linears",
        "rows": rows,
    }
    write("engine_packed_linears", out, args.out, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
