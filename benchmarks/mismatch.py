"""The train-inference mismatch per architecture and dtype: engine log-probs vs the learner's, same weights.

    .venv/bin/python benchmarks/mismatch.py [--smollm2 DIR] [--samples 32 --tokens 48]

For each architecture (tiny random Qwen2, Llama, Qwen3 configs; optionally SmolLM2-135M-Instruct)
and dtype (fp32; bf16 = engine weights in bf16 and the learner's forward under bf16 autocast), the
embedded engine samples `samples` continuations of `tokens` tokens at T=1 from random prompts, and
the torch learner takes one step on them: its `rollout/logprob_mismatch_*` metrics (the ones every
training step logs) are the result. An architecture the embedded engine cannot read is reported as
such. Writes benchmarks/results/mismatch.{json,md} with benchmarks/harness (provenance under `meta`, one writer);
`--from-results FILE` rewrites the page from a results file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import bench_paths  # noqa: F401  (puts the checkout on sys.path)
import torch

from benchmarks.harness.provenance import Provenance
from benchmarks.harness.report import quick_args, results_args, results_dir, rewrite, table, write

ARCHS = ("qwen2", "llama", "qwen3")


def random_model(arch: str, out: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """A tiny randomly initialised `arch` causal LM (2 layers, hidden 64, GQA) with `tokenizer_dir`'s tokenizer."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    names = {"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3"}[arch]
    common = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    if arch == "qwen3":
        common["head_dim"] = 32  # Qwen3's head_dim is its own setting (q/k RMSNorm over it)
    cfg = getattr(transformers, f"{names}Config")(**common)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{names}ForCausalLM")(cfg)
    with torch.no_grad():  # a random init is near-uniform; sharpen it so sampled tokens are not all ties
        model.lm_head.weight.mul_(8.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def measure(model_dir: Path, dtype: str, *, samples: int, tokens: int, seed: int = 0) -> dict[str, float]:
    """One learner step on engine samples of `model_dir` (weights and learner forward in `dtype`)."""
    from agent_rl.config import Recipe
    from agent_rl.engines.api import EngineOptions, SamplingParams
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.learners import build
    from agent_rl.types import Group, Trajectory

    recipe = Recipe.model_validate(
        {
            "name": "mismatch", "model": {"path": str(model_dir), "dtype": dtype},
            "envs": {"train": "tiny_arith.yaml"}, "train": {"steps": 1, "batch_prompts": 2},
            "learner": {"lr": 1e-6, "dtype": dtype, "micro_batch_size": samples},
            "algorithm": {"opob_mode": "proxy"},
        }
    )  # fmt: skip
    engine = EmbeddedEngine(
        model_dir, EngineOptions(max_batch=samples, max_seq_len=256, dtype=dtype), seed=seed
    )
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.scheduler.model.cfg.vocab_size
    prompts = [torch.randint(3, vocab, (12,), generator=gen).tolist() for _ in range(2)]

    async def sample() -> list:
        sp = lambda i: SamplingParams(max_new_tokens=tokens, seed=seed + i, ignore_eos=True)  # noqa: E731
        jobs = [engine.generate(prompts[i % 2], sp(i), request_id=f"r{i}") for i in range(samples)]
        return await asyncio.gather(*jobs)

    try:
        outs = asyncio.run(sample())
    finally:
        asyncio.run(engine.close())
    groups: dict[int, list[Trajectory]] = {0: [], 1: []}
    for i, o in enumerate(outs):
        t = Trajectory(uid=f"t{i}", group_id=f"g{i % 2}", prompt_ids=prompts[i % 2], reward=float(i % 3 == 0))
        t.append_sampled(o.token_ids, o.logprobs, 0)
        groups[i % 2].append(t)
    learner = build(recipe.learner_spec)
    try:
        m = learner.step([Group(f"g{k}", v) for k, v in groups.items()])
    finally:
        learner.close()
    return {k.removeprefix("rollout/logprob_mismatch_"): v for k, v in m.items() if "logprob_mismatch" in k}


def markdown(d: dict) -> str:
    """The results page from the JSON alone."""
    a, date = d["args"], d["meta"]["date"].replace("T", " ")[:16]

    def row(r: dict) -> list:
        if "error" in r:
            return [r["model"], r["dtype"], f"not run: {r['error']}", "", "", ""]
        return [
            r["model"],
            r["dtype"],
            f"{r['mean']:.2e}",
            f"{r['max']:.2e}",
            f"{r['frac']:.4f}",
            int(r["tokens"]),
        ]

    head = (
        f"# Engine vs learner log-prob mismatch ({date}, {a['samples']} samples x {a['tokens']} tokens, T=1)"
    )
    rows = table(
        ["model", "dtype", "mean abs", "max abs", "share > 0.1", "tokens"], [row(r) for r in d["rows"]]
    )
    return "\n".join([head, "", *rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smollm2", type=Path, help="also SmolLM2-135M-Instruct from this HF directory")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--tokens", type=int, default=48)
    results_args(p, "mismatch")
    quick_args(p, samples=4, tokens=8)
    args = p.parse_args(argv)
    if rewrite(args, "mismatch", markdown):
        return 0
    prov = Provenance()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tiny(Path(tmp) / "tok", sample_corpus(), vocab_size=512)
        models = {a: random_model(a, Path(tmp) / a, tok) for a in ARCHS}
        if args.smollm2:
            models["smollm2-135m (llama)"] = args.smollm2
        for name, d in models.items():
            for dtype in ("float32", "bfloat16"):
                t0 = time.time()
                try:
                    r = measure(d, dtype, samples=args.samples, tokens=args.tokens)
                except ValueError as e:  # the embedded engine refuses the architecture
                    r = {"error": str(e).split(": ", 1)[-1]}
                rows.append({"model": name, "dtype": dtype, **r, "seconds": time.time() - t0})
                print(json.dumps(rows[-1]), flush=True)
    settings = {"smollm2": str(args.smollm2), "samples": args.samples, "tokens": args.tokens}
    data = {"meta": prov.meta(), "args": settings, "rows": rows}
    write("mismatch", data, results_dir(args.out, scratch=args.quick, name="mismatch"), markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
