"""Peak memory and step time per learner rank for one long trajectory: Megatron TP=1 vs TP=2 (with and without SP).

    .venv/bin/python benchmarks/long_context.py [--lengths 2048,4096] [--hidden 256] [--layers 4]

One optimizer step of the Megatron learner (`MegatronRank.step`: forward, backward, the
TP/SP gradient reductions, DP sync, clipping, AdamW) on a batch of ONE trajectory of L tokens
(a quarter prompt, the rest sampled; loss vcpo with GRPO advantages, so the step is exactly
one forward/backward of that trajectory). Each layout runs in its own gloo worker processes
on the same cores (TP=1: one process with all threads; TP=2: two processes splitting them).
Per rank: the median step time over --repeats timed steps after one warm-up step, the bytes
autograd saved for backward (activation memory, counted once per storage), and the peak RSS
growth during a step (sampled every 2 ms; CPU) or torch.cuda.max_memory_allocated (GPU).
Ratios against TP=1 from the same invocation. Writes benchmarks/results/long_context.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class _PeakRss:
    """Highest resident set size seen while the block runs, sampled by a thread."""

    def __enter__(self) -> _PeakRss:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _saved_bytes(fn) -> int:
    """Bytes of distinct storages autograd saves for backward while fn() runs its forward passes."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _batch(length: int, vocab: int, seed: int):
    from vcpo.batch import PolicyBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, length), generator=g)
    loss_mask = torch.zeros(1, length)
    loss_mask[:, length // 4 :] = 1.0
    behaviour = torch.where(loss_mask > 0, torch.full((1, length), -7.0), torch.zeros(1, length))
    return PolicyBatch(
        ids, torch.ones_like(ids), loss_mask, behaviour, torch.tensor([1.0]), torch.tensor([0])
    )


def measure_step(learner, batch, repeats: int) -> dict:
    """This rank's median step time and peak RSS growth over `repeats` steps after a warm-up step,
    and the bytes autograd saves in one forward over the whole batch."""
    import torch.distributed as dist

    learner.step([batch])  # warm-up: allocator caches, lazy inits
    times, peaks = [], []
    for _ in range(repeats):
        dist.barrier()
        with _PeakRss() as mem:
            t0 = time.perf_counter()
            learner.step([batch])
            times.append(time.perf_counter() - t0)
        peaks.append(mem.peak - mem.start)
    sub = batch.select(torch.arange(batch.size))
    saved = _saved_bytes(lambda: learner.logprobs(learner.model, sub.input_ids, sub.attention_mask))
    return {
        "step_s": statistics.median(times),
        "peak_rss_growth_bytes": max(peaks),
        "saved_activation_bytes": saved,
    }


def _worker(rank: int, world: int, port: int, spec, lengths: list[int], repeats: int, out: str) -> None:
    import torch.distributed as dist

    from agent_rl.learners.megatron.rank import MegatronRank

    torch.set_num_threads(max(1, (torch.get_num_threads() if world == 1 else 1)))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    learner = MegatronRank(spec)
    vocab = learner.shape.vocab_size
    rows = []
    for length in lengths:
        batch = _batch(length, vocab, seed=length)
        rows.append({"length": length, "rank": rank, **measure_step(learner, batch, repeats)})
    all_rows: list = [None] * world
    dist.all_gather_object(all_rows, rows)
    if rank == 0:
        Path(out).write_text(json.dumps([r for rs in all_rows for r in rs]))
    dist.destroy_process_group()


def run_layout(spec, lengths: list[int], repeats: int, worker=_worker) -> list[dict]:
    """Rows from `worker(rank, world, port, spec, lengths, repeats, out)` in spec.world gloo processes."""
    from agent_rl.learners._pool import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        world = spec.world
        torch.multiprocessing.spawn(
            worker, args=(world, free_port(), spec, lengths, repeats, str(out)), nprocs=world, join=True
        )
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="2048,4096")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    from agent_rl.config import Recipe
    from agent_rl.learners.megatron import require_megatron
    from agent_rl.learners.megatron.model import ParallelConfig
    from agent_rl.learners.megatron.rank import MegatronSpec
    from agent_rl.learners.torch_learner import rank_spec
    from agent_rl.tools.tiny import build_model

    require_megatron()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(
            args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
            max_positions=max(lengths),
        )  # fmt: skip
        model.save_pretrained(tmp)
        n_params = sum(p.numel() for p in model.parameters())
        del model
        recipe = Recipe.model_validate({
            "name": "long-context-bench", "model": {"path": tmp}, "envs": {"train": "unused.yaml"},
            "train": {"steps": 1000, "batch_prompts": 1},
            "learner": {"backend": "megatron", "lr": 1e-5},
            "algorithm": {"loss": "vcpo", "advantage": "grpo"},
        })  # fmt: skip
        rs = rank_spec(recipe.learner_spec)
        layouts = {
            "tp1": ParallelConfig(tp=1),
            "tp2": ParallelConfig(tp=2),
            "tp2_sp": ParallelConfig(tp=2, sp=True),
        }
        results = {}
        for name, par in layouts.items():
            print(f"[{time.strftime('%H:%M:%S')}] {name}: lengths {lengths}", flush=True)
            results[name] = run_layout(MegatronSpec(rank=rs, par=par), lengths, args.repeats)

    summary = []
    for length in lengths:
        for name, rows in results.items():
            mine = [r for r in rows if r["length"] == length]
            summary.append({
                "length": length, "layout": name,
                "step_s": max(r["step_s"] for r in mine),
                "saved_activation_mib_per_rank": max(r["saved_activation_bytes"] for r in mine) / 2**20,
                "peak_rss_growth_mib_per_rank": max(r["peak_rss_growth_bytes"] for r in mine) / 2**20,
            })  # fmt: skip
        base = next(x for x in summary if x["length"] == length and x["layout"] == "tp1")
        for x in summary:
            if x["length"] == length:
                for key in ("step_s", "saved_activation_mib_per_rank", "peak_rss_growth_mib_per_rank"):
                    x[f"ratio_{key}"] = x[key] / base[key]
    meta = {
        "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads,
                  "vocab": args.vocab, "params": n_params},
        "device": "cpu (gloo, megatron local spec + cpu_compat)" if not torch.cuda.is_available() else "cuda",
        "cpus": torch.get_num_threads(), "platform": platform.platform(), "repeats": args.repeats,
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "long_context.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "raw": results}, indent=2)
    )
    lines = [
        "# Long-context learner step: Megatron TP=1 vs TP=2, with and without sequence parallelism",
        "",
        f"Model: Qwen2-shaped, hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV, "
        f"vocab {args.vocab} ({n_params / 1e6:.1f}M params). {meta['device']}, {meta['cpus']} threads in all. "
        "One optimizer step on ONE trajectory of L tokens; per rank: median step time, autograd-saved "
        "activations, peak RSS growth during the step. Ratios are against TP=1 from the same run.",
        "",
        "| L | layout | step s (slowest rank) | ratio | saved activations MiB/rank | ratio | peak RSS growth MiB/rank | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in summary:
        lines.append(
            f"| {x['length']} | {x['layout']} | {x['step_s']:.2f} | {x['ratio_step_s']:.2f} "
            f"| {x['saved_activation_mib_per_rank']:.0f} | {x['ratio_saved_activation_mib_per_rank']:.2f} "
            f"| {x['peak_rss_growth_mib_per_rank']:.0f} | {x['ratio_peak_rss_growth_mib_per_rank']:.2f} |"
        )
    (OUT / "long_context.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
