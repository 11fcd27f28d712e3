"""What grammar-constrained sampling does to importance weights and ESS, for each recording of log mu.

    .venv/bin/python benchmarks/constrained_is.py [--model-dir DIR] [--samples 32] [--seeds 3]

On-policy (the learner's weights are the engine's), the embedded engine samples B answers under a
JSON-schema constraint (T=1); the learner's log pi of each token is a plain transformers forward pass
(full vocabulary). Per trajectory, log w = sum_t (log pi - log mu) with log mu either
- `unmasked` (the default, `rollout.constrained_logprobs`): the full-vocabulary log-prob of the token, or
- `masked`: the log-prob of the masked distribution actually sampled from (its renormalised mass),
so under `masked` log w = sum_t log Z_t (Z_t: the mass the mask kept at token t). Reported: ESS/B of a
batch of constrained trajectories alone and mixed half-and-half with unconstrained ones (as an agent's
episodes mix constrained and free calls), the mean per-token log Z, and the lr scale VCPO's sqrt rule
would apply. Model: the tiny random Qwen2 (the worst case: it knows no JSON) and, with --model-dir,
a real one (e.g. SmolLM2-135M-Instruct). Writes benchmarks/results/constrained_is.{json,md} with benchmarks/harness
(provenance under `meta`, median and range by `stats.spread`, one writer); `--from-results FILE` rewrites the page
from a results file's per-seed rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import bench_paths  # noqa: F401  (puts the checkout on sys.path)
import torch

from benchmarks.harness.provenance import Provenance
from benchmarks.harness.report import quick_args, results_args, results_dir, rewrite, table, write
from benchmarks.harness.stats import spread
from vcpo.importance import effective_sample_size, ess_lr_scale

KEYS = ["closed", "tokens_per_answer", "mean_token_log_z", "max_abs_unmasked_log_w"] + [
    f"{k}_{m}"
    for k in ("ess_constrained", "ess_mixed", "lr_scale_mixed", "mean_log_w")
    for m in ("unmasked", "masked")
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "confident": {"type": "boolean"}},
    "required": ["answer", "confident"],
}
PROMPT = "What is 3 * 4? Reply as JSON with the answer and whether you are confident."


async def sample(model_dir: str, n: int, seed: int, constrained: bool, max_tokens: int):
    from agent_rl.engines.api import Constraint, EngineOptions, SamplingParams
    from agent_rl.engines.embedded.engine import EmbeddedEngine

    eng = EmbeddedEngine(model_dir, EngineOptions(max_batch=n, max_seq_len=512), seed=seed)
    try:
        tok = eng.scheduler.tokenizer
        text = PROMPT
        if getattr(tok, "chat_template", None):
            msgs = [{"role": "user", "content": PROMPT}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        c = Constraint("json_schema", json.dumps(SCHEMA)) if constrained else None
        gens = await asyncio.gather(
            *(
                eng.generate(
                    ids,
                    SamplingParams(max_new_tokens=max_tokens, seed=seed * 1000 + i, constraint=c),
                    request_id=f"r{i}",
                )
                for i in range(n)
            )
        )
    finally:
        await eng.close()
    return ids, gens


def learner_logprobs(model, prompt: list[int], gens) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for g in gens:
            logits = model(torch.tensor([prompt + g.token_ids])).logits[0].float()
            lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
            out.append(lp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0])
    return out


def ess_ratio(log_w: list[float]) -> float:
    return effective_sample_size(torch.tensor(log_w, dtype=torch.float64))[1]


def measure(model_dir: str, n: int, seed: int, max_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt, guided = asyncio.run(sample(model_dir, n, seed, True, max_tokens))
    _, free = asyncio.run(sample(model_dir, n, seed, False, max_tokens))
    pi_g, pi_f = learner_logprobs(model, prompt, guided), learner_logprobs(model, prompt, free)
    logw = {
        mode: [float((p - torch.tensor(getattr(g, key))).sum()) for p, g in zip(pi_g, guided, strict=True)]
        for mode, key in (("unmasked", "unmasked_logprobs"), ("masked", "logprobs"))
    }
    free_w = [float((p - torch.tensor(g.logprobs)).sum()) for p, g in zip(pi_f, free, strict=True)]
    half = n // 2
    logz = [m - u for g in guided for m, u in zip(g.unmasked_logprobs, g.logprobs, strict=True)]
    parsed = sum(1 for g in guided if g.finish_reason == "stop")
    row = {
        "seed": seed,
        "tokens_per_answer": statistics.mean(len(g.token_ids) for g in guided),
        "closed": parsed / n,
    }
    row["mean_token_log_z"] = statistics.mean(logz)
    row["max_abs_unmasked_log_w"] = max(abs(x) for x in logw["unmasked"])
    for mode in ("unmasked", "masked"):
        row[f"ess_constrained_{mode}"] = ess_ratio(logw[mode])
        row[f"ess_mixed_{mode}"] = ess_ratio(logw[mode][:half] + free_w[:half])
        row[f"lr_scale_mixed_{mode}"] = ess_lr_scale(row[f"ess_mixed_{mode}"], "sqrt", 1.0)
        row[f"mean_log_w_{mode}"] = statistics.mean(logw[mode])
    return row


def markdown(d: dict) -> str:
    """The results page from the JSON alone: per metric and model, the median over seeds (min-max)."""
    results, settings = d["results"], d.get("settings", d["meta"])  # before the harness: settings under meta

    def cell(rows: list[dict], k: str) -> str:
        s = spread(r[k] for r in rows)
        return f"{s['median']:.3g} ({s['min']:.3g}-{s['max']:.3g})"

    return "\n".join([
        "# Constrained decoding: importance weights and ESS, on-policy (benchmarks/constrained_is.py)", "",
        f"B = {settings['samples']} answers per batch, T = 1, median over {settings['seeds']} seeds (min-max).", "",
        *table(["metric", *results], [[k, *(cell(rows, k) for rows in results.values())] for k in KEYS]),
    ]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=None, help="a real HF model (default: only the tiny random one)")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    results_args(p, "constrained_is")
    quick_args(p, samples=4, seeds=2, max_tokens=8)
    args = p.parse_args(argv)
    if rewrite(args, "constrained_is", markdown):
        return
    prov = Provenance()
    torch.set_num_threads(1)
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        from agent_rl.tools.tiny import build_tiny, sample_corpus

        models["tiny (random 2-layer Qwen2, vocab 512)"] = str(
            build_tiny(Path(tmp) / "tiny", sample_corpus(), vocab_size=512, seed=0)
        )
        if args.model_dir:
            models[Path(args.model_dir).name] = args.model_dir
        results = {
            name: [measure(d, args.samples, s, args.max_tokens) for s in range(args.seeds)]
            for name, d in models.items()
        }
    settings = {"samples": args.samples, "seeds": args.seeds, "threads": 1}
    out = results_dir(args.out, scratch=args.quick, name="constrained_is")
    write("constrained_is", {"meta": prov.meta(), "settings": settings, "results": results}, out, markdown)


if __name__ == "__main__":
    main()
