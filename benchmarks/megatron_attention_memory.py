"""Memory of one Megatron forward+backward vs trajectory length on CPU: torch-SDPA attention and the chunked
log-prob head (the learner now) against megatron-core's local DotProductAttention and its fp32 cross-entropy head.

    .venv/bin/python -m benchmarks.megatron_attention_memory [--lengths 1024,2048,4096,8192,16384]

One process (gloo, world size 1, the CPU compatibility layer), a random Qwen2-shaped model
(hidden 256, 2 layers, 8 heads / 4 KV heads, vocab 4096 by default), fp32, ONE trajectory of L
tokens packed as the learner packs it. For each variant and L: the bytes autograd saves for
backward (distinct storages: activation memory, the same on every machine) and the peak RSS
growth during forward+backward (sampled every 2 ms). Variants:

- `sdpa+chunked`: what the learner runs without Transformer Engine (attention.SDPAttention,
  linear_logprobs);
- `megatron-local+chunked`: megatron's local DotProductAttention ([heads, S, S] scores, a dense
  causal mask) with the same head; run only while its scores fit (--max-dense), larger L reported
  as not run with the bytes its scores alone would take;
- `sdpa+fp32-logits`: SDPA attention with megatron's head (output layer, [S, V] logits cast to
  fp32, vocab_parallel_cross_entropy, which keeps an fp32 softmax of that size for backward).

A second table gives what bounds memory on a GPU: the activation bytes autograd keeps per token
and per layer at the Qwen2.5-0.5B layer shape (hidden 896, 14 heads / 2 KV heads, FFN 4864), bf16,
for each learner.gradient_checkpointing setting (the slope in L of a 2-layer minus a 1-layer model,
so weights and the head cancel), and those bytes for 24 layers at 32k and 128k tokens.

Writes benchmarks/results/megatron_attention_memory.{json,md}. Not a timed test: memory only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from benchmarks.long_context import _PeakRss, _saved_bytes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
VARIANTS = ("sdpa+chunked", "megatron-local+chunked", "sdpa+fp32-logits")


def _dense_attention(model) -> None:
    """Swap every layer's core attention for megatron-core's own local DotProductAttention (the old path)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    for layer in model.decoder.layers:
        attn = layer.self_attention
        attn.core_attention = DotProductAttention(
            model.config, layer.layer_number, AttnMaskType.causal, attention_type="self"
        )


def _fp32_logits_logprobs(model, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """megatron's head: [S, B, V] logits from the output layer, to fp32, vocab_parallel_cross_entropy."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = hidden @ model.output_weight().t()
    return -vocab_parallel_cross_entropy(logits.float(), labels.t().contiguous())


def _forward(model, variant: str, ids: torch.Tensor) -> torch.Tensor:
    from agent_rl.learners.megatron import packing
    from agent_rl.learners.megatron.logprobs import _token_logprobs
    from agent_rl.learners.megatron.model import ParallelConfig

    n = ids.shape[1]
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]
    pos = torch.arange(n)[None]
    if variant == "megatron-local+chunked":
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)[None, None]
        hidden = model(ids, pos, mask)
    else:
        layout = packing.plan(torch.ones_like(ids), ParallelConfig())
        hidden = model(ids, pos, None, packed_seq_params=packing.packed_seq_params(layout, "cpu"))
    if variant == "sdpa+fp32-logits":
        return _fp32_logits_logprobs(model, hidden, labels)
    return _token_logprobs(model, hidden, labels, ParallelConfig(), 1.0)


def _release_freed_memory() -> None:
    """Hand memory freed by earlier measurements back to the OS (glibc keeps it), so RSS growth is this one's."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(model, variant: str, length: int, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(length))
    saved = _saved_bytes(lambda: _forward(model, variant, ids))
    model.zero_grad(set_to_none=True)
    _release_freed_memory()
    with _PeakRss() as mem:
        _forward(model, variant, ids).sum().backward()
    model.zero_grad(set_to_none=True)
    return {"saved_bytes": saved, "peak_rss_growth_bytes": mem.peak - mem.start}


RECOMPUTE = {
    "off": {},
    "full (uniform, 1 layer)": {"granularity": "full", "method": "uniform", "num_layers": 1},
    "selective core_attn": {"granularity": "selective", "modules": ("core_attn",)},
    "selective core_attn+mlp": {"granularity": "selective", "modules": ("core_attn", "mlp")},
}


def per_layer_bytes(lengths: tuple[int, int] = (512, 1024)) -> list[dict]:
    """Saved activation bytes per token per layer at the 0.5B layer shape in bf16, per recompute setting."""
    from agent_rl.learners.megatron.convert import load_hf_into_megatron
    from agent_rl.learners.megatron.model import ParallelConfig, Recompute, build_gpt_model
    from agent_rl.learners.megatron.shape import shape_from_hf_config
    from agent_rl.tools.tiny import build_model

    rows = []
    for name, rc in RECOMPUTE.items():
        slope = {}
        for layers in (1, 2):
            hf = build_model(
                1024, hidden=896, layers=layers, heads=14, kv_heads=2, intermediate=4864, max_positions=4096
            )
            shape = shape_from_hf_config(hf.config)
            model = build_gpt_model(
                shape, ParallelConfig(), dtype=torch.bfloat16, cpu=True, recompute=Recompute(**rc)
            )
            load_hf_into_megatron(model, hf.state_dict(), shape, tp_rank=0, tp_size=1, te=False)
            model.train()
            saved = [
                _saved_bytes(lambda n=n, m=model: _forward(m, "sdpa+chunked", torch.randint(0, 1024, (1, n))))
                for n in lengths
            ]
            slope[layers] = (saved[1] - saved[0]) / (lengths[1] - lengths[0])
            del model, hf
        per_token = slope[2] - slope[1]
        print(
            f"[{time.strftime('%H:%M:%S')}] 0.5B layer, recompute {name}: {per_token:.0f} B/token/layer",
            flush=True,
        )
        rows.append({
            "recompute": name, "bytes_per_token_per_layer": per_token,
            "gib_24_layers_32k": per_token * 24 * 32768 / 2**30, "gib_24_layers_128k": per_token * 24 * 131072 / 2**30,
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-dense", type=int, default=4096, help="longest L for megatron's dense attention")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    commit = subprocess.run(  # the code this run imports (the tree may move while it runs)
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()

    import torch.distributed as dist

    from agent_rl.learners._dp import _free_port, join_rank_group
    from agent_rl.learners.megatron import require_megatron
    from agent_rl.learners.megatron.convert import load_hf_into_megatron
    from agent_rl.learners.megatron.model import ParallelConfig, build_gpt_model
    from agent_rl.learners.megatron.rank import init_model_parallel
    from agent_rl.learners.megatron.shape import shape_from_hf_config
    from agent_rl.tools.tiny import build_model

    require_megatron()
    join_rank_group(0, 1, f"tcp://127.0.0.1:{_free_port()}", device="cpu")
    init_model_parallel(ParallelConfig(), dp=1, cpu=True)
    hf = build_model(
        args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
        max_positions=max(lengths),
    )  # fmt: skip
    shape = shape_from_hf_config(hf.config)
    state = hf.state_dict()
    n_params = sum(p.numel() for p in hf.parameters())
    del hf
    rows = []
    for variant in VARIANTS:
        model = build_gpt_model(shape, ParallelConfig(), cpu=True)
        load_hf_into_megatron(model, state, shape, tp_rank=0, tp_size=1, te=False)
        model.train()
        if variant == "megatron-local+chunked":
            _dense_attention(model)
        for length in lengths:
            row = {"variant": variant, "length": length}
            if variant == "megatron-local+chunked" and length > args.max_dense:
                scores = args.heads * length * length * 4 * args.layers
                row["not_run"] = (
                    f"its [heads, S, S] fp32 scores alone: {scores / 2**30:.1f} GiB over {args.layers} layers"
                )
            else:
                print(f"[{time.strftime('%H:%M:%S')}] {variant} L={length}", flush=True)
                row.update(measure(model, variant, length, args.vocab))
            rows.append(row)
        del model
    layer_rows = per_layer_bytes()
    dist.destroy_process_group()

    meta = {
        "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads,
                  "vocab": args.vocab, "params": n_params, "dtype": "float32"},
        "device": "cpu (gloo world 1, megatron local spec + cpu_compat)", "threads": torch.get_num_threads(),
        "platform": platform.platform(), "torch": torch.__version__,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "megatron_attention_memory.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "per_layer_0p5b": layer_rows}, indent=2)
    )
    m = meta["model"]
    lines = [
        "# Megatron forward+backward memory vs trajectory length (CPU)",
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['device']}, {meta['threads']} threads, torch {meta['torch']}. "
        f"Random Qwen2-shaped model: hidden {m['hidden']}, {m['layers']} layers, {m['heads']} heads / "
        f"{m['kv_heads']} KV, vocab {m['vocab']} ({m['params'] / 1e6:.1f}M params), fp32, one trajectory of L tokens. "
        "Saved: bytes autograd keeps for backward (distinct storages). Peak: RSS growth during forward+backward. "
        "Growth per doubling of L: 2.0 is linear, 4.0 quadratic.",
        "",
        "| variant | L | saved MiB | x per doubling | peak RSS growth MiB | x per doubling |",
        "|---|---|---|---|---|---|",
    ]
    prev: dict[str, dict] = {}
    for r in rows:
        if "not_run" in r:
            lines.append(f"| {r['variant']} | {r['length']} | not run: {r['not_run']} | | | |")
            continue
        p = prev.get(r["variant"])
        ratio = lambda k, r=r, p=p: f"{r[k] / p[k]:.2f}" if p and p[k] > 0 else ""  # noqa: E731
        lines.append(
            f"| {r['variant']} | {r['length']} | {r['saved_bytes'] / 2**20:.0f} | {ratio('saved_bytes')} "
            f"| {r['peak_rss_growth_bytes'] / 2**20:.0f} | {ratio('peak_rss_growth_bytes')} |"
        )
        prev[r["variant"]] = r
    lines += [
        "",
        "## Activations per layer at the Qwen2.5-0.5B layer shape (bf16), by learner.gradient_checkpointing",
        "",
        "Bytes autograd keeps per token per layer (hidden 896, 14 heads / 2 KV, FFN 4864; the slope in L of a "
        "2-layer minus a 1-layer model), and for the 24 layers of the 0.5B model. Full recompute also holds one "
        "layer's activations again while it re-runs that layer in backward.",
        "",
        "| recompute | bytes / token / layer | 24 layers, 32k tokens GiB | 24 layers, 128k tokens GiB |",
        "|---|---|---|---|",
    ]
    for r in layer_rows:
        lines.append(
            f"| {r['recompute']} | {r['bytes_per_token_per_layer']:.0f} | {r['gib_24_layers_32k']:.1f} "
            f"| {r['gib_24_layers_128k']:.1f} |"
        )
    (OUT / "megatron_attention_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
