"""fp32 LM head (model.lm_head_fp32): the learner-engine log-prob mismatch in bf16 with and without it, and its cost.

    .venv/bin/python benchmarks/fp32_head.py [--smollm2 DIR] [--samples 16 --tokens 32 --steps 5]

For each model (a tiny random Qwen2 with a sharpened head, as benchmarks/mismatch.py builds it; SmolLM2-135M-
Instruct from DIR, as `agent-rl prepare smollm2` writes it) in bf16 (engine weights in bf16, the learner's
forward under bf16 autocast) and each setting of `model.lm_head_fp32` (both sides together): the embedded engine
samples `samples` continuations of `tokens` tokens at T=1, the torch learner scores and trains on them. Reported:
the RMS, mean and max |log π − log μ| over the sampled tokens and the share above 0.1 (the learner's own
`rollout/logprob_mismatch_*` of its first step: same weights on both sides), the engine's sampling seconds,
and the learner's step seconds (median of `steps` steps after the first, the two settings' learners stepping in
turn so that a change of load hits both). Ratios on/off are within one model, measured in the same run. The machine's 1-minute load average is recorded before and after each cell: timings
from a loaded machine are not idle-machine figures. Writes benchmarks/results/fp32_head.{json,md}
(`--out` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_paths import portable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mismatch import random_model  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"


def sample(model_dir: Path, fp32_head: bool, *, samples: int, tokens: int, seed: int = 0):
    """(recipe, the engine's samples as two groups, sampling seconds) with the engine's head as `fp32_head` says."""
    from agent_rl.config import Recipe
    from agent_rl.engines.api import SamplingParams
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.types import Group, Trajectory

    recipe = Recipe.model_validate(
        {
            "name": "fp32_head", "model": {"path": str(model_dir), "dtype": "bfloat16", "lm_head_fp32": fp32_head},
            "envs": {"train": "tiny_arith.yaml"}, "train": {"steps": 100, "batch_prompts": 2},
            "learner": {"lr": 1e-6, "dtype": "bfloat16", "micro_batch_size": samples},
            "algorithm": {"opob_mode": "proxy"},
        }
    )  # fmt: skip
    engine = EmbeddedEngine(model_dir, recipe.engines.options("bfloat16", fp32_head), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.scheduler.model.cfg.vocab_size
    prompts = [torch.randint(3, vocab, (12,), generator=gen).tolist() for _ in range(2)]

    async def run() -> list:
        sp = lambda i: SamplingParams(max_new_tokens=tokens, seed=seed + i, ignore_eos=True)  # noqa: E731
        try:
            return await asyncio.gather(
                *(engine.generate(prompts[i % 2], sp(i), request_id=f"r{i}") for i in range(samples))
            )
        finally:
            await engine.close()

    t0 = time.perf_counter()
    outs = asyncio.run(run())
    seconds = time.perf_counter() - t0
    groups: dict[int, list[Trajectory]] = {0: [], 1: []}
    for i, o in enumerate(outs):
        t = Trajectory(uid=f"t{i}", group_id=f"g{i % 2}", prompt_ids=prompts[i % 2], reward=float(i % 3 == 0))
        t.append_sampled(o.token_ids, o.logprobs, 0)
        groups[i % 2].append(t)
    return recipe, [Group(f"g{k}", v) for k, v in groups.items()], seconds


def measure(model_dir: Path, *, samples: int, tokens: int, steps: int) -> list[dict]:
    """Both cells of one model: off and on sample, then their learners take one step each (the mismatch, on the
    engine's weights), then `steps` timed steps each, alternating off/on so a change of load hits both alike."""
    from agent_rl.learners import build

    cells = []
    for fp32_head in (False, True):
        load0 = os.getloadavg()[0]
        recipe, batch, sample_s = sample(model_dir, fp32_head, samples=samples, tokens=tokens)
        cells.append({"fp32": fp32_head, "recipe": recipe, "batch": batch, "sample_seconds": sample_s,
                      "load_before": load0, "times": []})  # fmt: skip
    learners = [build(c["recipe"].learner_spec) for c in cells]
    try:
        for c, lr in zip(cells, learners, strict=True):
            first = dict(lr.step(c["batch"]))
            c["m"] = {
                k.removeprefix("rollout/logprob_mismatch_"): v for k, v in first.items() if "mismatch" in k
            }
        for _ in range(steps):
            for c, lr in zip(cells, learners, strict=True):
                t0 = time.perf_counter()
                lr.step(c["batch"])
                c["times"].append(time.perf_counter() - t0)
    finally:
        for lr in learners:
            lr.close()
    return [
        {"lm_head_fp32": c["fp32"], **c["m"], "sample_seconds": c["sample_seconds"],
         "step_seconds": statistics.median(c["times"]), "step_seconds_min": min(c["times"]),
         "step_seconds_all": c["times"],
         "load_before": c["load_before"], "load_after": os.getloadavg()[0]}
        for c in cells
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smollm2", type=Path, help="also SmolLM2-135M-Instruct from this HF directory")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="timed learner steps per cell (after the first)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tiny(Path(tmp) / "tok", sample_corpus(), vocab_size=512)
        models = {"toy (tiny random qwen2)": random_model("qwen2", Path(tmp) / "qwen2", tok)}
        if args.smollm2:
            models["smollm2-135m-instruct"] = args.smollm2
        for name, d in models.items():
            for r in measure(d, samples=args.samples, tokens=args.tokens, steps=args.steps):
                rows.append({"model": name, **r})
                print(json.dumps(rows[-1]), flush=True)
    ratios = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        off, on = (
            next(r for r in rows if r["model"] == name and r["lm_head_fp32"] is v) for v in (False, True)
        )
        ratios[name] = {
            "rms_on_over_off": on["rms"] / off["rms"] if off["rms"] else None,
            "step_on_over_off": on["step_seconds"] / off["step_seconds"],
            "step_min_on_over_off": on["step_seconds_min"] / off["step_seconds_min"],
            "sample_on_over_off": on["sample_seconds"] / off["sample_seconds"],
        }
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, shared: see each cell's load)",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "ratios": ratios}
    (args.out / "fp32_head.json").write_text(portable(json.dumps(doc, indent=2)))
    lines = [
        f"# fp32 LM head: learner vs engine in bf16 ({meta['date']}, {args.samples} samples x {args.tokens} "
        f"tokens, T=1; torch {meta['torch']}, transformers {meta['transformers']})",
        "",
        "| model | lm_head_fp32 | RMS | mean abs | max abs | share > 0.1 | tokens | sample s | step s | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {'on' if r['lm_head_fp32'] else 'off'} | {r['rms']:.4f} | {r['mean']:.4f} | "
            f"{r['max']:.3f} | {r['frac']:.4f} | {int(r['tokens'])} | {r['sample_seconds']:.2f} | "
            f"{r['step_seconds']:.2f} | {r['load_before']:.1f}-{r['load_after']:.1f} |"
        )
    lines += [
        "",
        "| model | RMS on/off | learner step on/off (median) | (fastest step) | engine sampling on/off |",
        "|---|---|---|---|---|",
    ]
    for name, q in ratios.items():
        rms = "n/a" if q["rms_on_over_off"] is None else f"{q['rms_on_over_off']:.2f}"
        lines.append(
            f"| {name} | {rms} | {q['step_on_over_off']:.2f} | {q['step_min_on_over_off']:.2f} | "
            f"{q['sample_on_over_off']:.2f} |"
        )
    (args.out / "fp32_head.md").write_text(portable("\n".join(lines) + "\n"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
