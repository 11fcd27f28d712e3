"""Rollout routing replay on a small Mixture-of-Experts model: mismatch, routing agreement, and stability at k=4.

    nice -n 15 .venv/bin/python benchmarks/moe_replay.py [--quick] [--seeds 3] [--steps 30]

1. A random-init Qwen3-MoE (hidden 128, 2 layers, 8 experts, top-2, renormalised gates) over the tiny
   BPE tokenizer, warm-started by SFT on the tiny_arith teacher traces as examples/tiny_tir.py makes the
   dense one (fewer traces: the MoE's eager experts are slower to train on CPU).
2. Mismatch: the embedded engine samples `--samples` episodes' first turns (T=1) from tiny_arith prompts;
   the torch learner takes one step on them with routing replay off and on, in fp32 and bf16 (engine weights
   and learner autocast): `rollout/logprob_mismatch_*` and `rollout/routing_agreement`, as every training
   step logs them. Three sampling seeds per cell.
3. Stability: RL on tiny_arith (recipes/tiny_tir.yaml) in bf16 at staleness bound k=4, replay off and on,
   `--seeds` seeds each: final held-out accuracy, last-10-step reward, the worst ESS ratio and gradient norm,
   mean mismatch and agreement over the run.

Resumable: every stage writes its result under --work (default runs/moe_replay) and is skipped when present; each
finished cell is a line of WORK/cells/runs.jsonl (benchmarks/harness/runner.py), skipped by the next invocation; an
interrupted RL run continues from its last checkpoint. Results: benchmarks/results/moe_replay.{json,md}
(benchmarks/harness: provenance, mean ± SE, one writer); `--from-results FILE` rewrites them from a results file alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_paths  # noqa: F401  (puts the checkout on sys.path)
import torch

from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import log, results_args, rewrite, table, write
from benchmarks.harness.runner import Job, Runner, plan, read_runs
from benchmarks.harness.stats import mean_se

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
MODEL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=256, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
             norm_topk_prob=True, max_position_embeddings=2048, initializer_range=0.02)  # fmt: skip
SFT_TRACES, SFT_DRILL = 1500, 1500
SFT = dict(epochs=2, lr=2e-3, batch_size=16, max_len=128, warmup_steps=10)
DTYPES, REPLAYS = ("float32", "bfloat16"), ("off", "rollout")


def stage(name: str) -> None:
    print(f"\n=== {name} [{time.strftime('%H:%M:%S')}]", flush=True)


def build_base(out: Path) -> Path:
    """Tiny BPE tokenizer over the tiny_arith corpus + a random Qwen3-MoE over it."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from agent_rl.tools.tiny import train_tokenizer
    from envs.tiny_arith import corpus

    tok = train_tokenizer(corpus(), 512)
    cfg = Qwen3MoeConfig(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None, tie_word_embeddings=False, **MODEL)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def warm_start(base: Path, out: Path, work: Path, quick: bool) -> Path:
    if str(ROOT) not in sys.path:  # examples/ is not an installed package
        sys.path.insert(0, str(ROOT))
    from agent_rl.tools.sft import run_sft
    from envs.tiny_arith import teacher_traces

    n, drill = (200, 200) if quick else (SFT_TRACES, SFT_DRILL)
    rows = [tr.sft_row() for tr in teacher_traces(n, seed=7, tool_rate=0.3)]
    rows += [
        tr.sft_row(train_first_token=False)
        for tr in teacher_traces(drill, seed=8, tool_rate=1.0, easy_fraction=0.0)
    ]
    data = work / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_sft(base, data, out, **(SFT | ({"epochs": 1} if quick else {})))


def recipe_for(model_dir: Path, run_dir: Path, *sets: str):
    from agent_rl.config import load_recipe

    base = [
        f"model.path={model_dir}",
        f"logging.run_dir={run_dir}",
        "logging.tensorboard=false",
        "monitor.on_warning=log",
    ]
    return load_recipe(ROOT / "recipes" / "tiny_tir.yaml", base + list(sets), check_model=True)


def mismatch_cell(model_dir: Path, dtype: str, replay: str, seed: int, samples: int) -> dict[str, float]:
    """One learner step on `samples` engine first turns of tiny_arith prompts: the step's mismatch metrics."""
    import envs
    from agent_rl.engines.api import EngineOptions, SamplingParams
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.learners import build as build_learner
    from agent_rl.types import Group, Trajectory

    recipe = recipe_for(model_dir, Path("/nonexistent"), f"model.dtype={dtype}", f"learner.dtype={dtype}",
                        f"algorithm.routing_replay={replay}", f"learner.micro_batch_size={samples}")  # fmt: skip
    from transformers import AutoTokenizer

    spec = envs.load(recipe.envs.train)
    env = envs.make(spec, AutoTokenizer.from_pretrained(model_dir))
    prompts = [env.reset(task) for task in env.tasks("test")[: max(2, samples // 4)]]  # 4 samples per prompt
    engine = EmbeddedEngine(
        model_dir, EngineOptions(max_batch=samples, max_seq_len=256, dtype=dtype), seed=seed
    )

    async def sample():
        sp = [SamplingParams(max_new_tokens=48, seed=seed * 1000 + i, stop=env.stop_strings,
                             return_routed_experts=True) for i in range(samples)]  # fmt: skip
        return await asyncio.gather(*(engine.generate(prompts[i % len(prompts)], sp[i], request_id=f"r{i}")
                                      for i in range(samples)))  # fmt: skip

    try:
        outs = asyncio.run(sample())
    finally:
        asyncio.run(engine.close())
    groups: dict[int, list[Trajectory]] = {}
    for i, o in enumerate(outs):
        g = i % len(prompts)
        t = Trajectory(uid=f"t{i}", group_id=f"g{g}", prompt_ids=prompts[g], reward=float(i % 3 == 0))
        t.append_sampled(o.token_ids, o.logprobs, o.versions)
        t.set_routed_experts(o.routed_experts)
        groups.setdefault(g, []).append(t)
    learner = build_learner(recipe.learner_spec)
    try:
        m = learner.step([Group(f"g{k}", v) for k, v in groups.items()])
    finally:
        learner.close()
    keys = ("rollout/logprob_mismatch_mean", "rollout/logprob_mismatch_max", "rollout/logprob_mismatch_frac",
            "rollout/logprob_mismatch_tokens", "rollout/routing_agreement", "learner/moe_aux_loss")  # fmt: skip
    return {k.split("/")[-1].removeprefix("logprob_"): float(m[k]) for k in keys if k in m}


def rl_cell(model_dir: Path, run_dir: Path, replay: str, seed: int, steps: int) -> dict[str, float]:
    """One RL run (bf16, k=4) in a subprocess (resumed from its checkpoint), then its held-out eval."""
    sets = [f"model.path={model_dir}", f"logging.run_dir={run_dir}", "logging.tensorboard=false",
            "model.dtype=bfloat16", "learner.dtype=bfloat16", "buffer.max_staleness=4", f"train.steps={steps}",
            f"train.seed={seed}", f"algorithm.routing_replay={replay}", "checkpoint.every=10", "eval.every=0", "monitor.on_warning=log"]  # fmt: skip
    cmd = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        str(ROOT / "recipes" / "tiny_tir.yaml"),
    ]
    cmd += [x for s in sets for x in ("--set", s)]
    if (run_dir / "checkpoints").is_dir():
        cmd += ["--resume", str(run_dir)]
    subprocess.run(cmd, cwd=ROOT, check=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    from agent_rl.evaluate import evaluate
    from agent_rl.metrics import read_metrics

    records = read_metrics(run_dir)
    report = evaluate(
        recipe_for(model_dir, run_dir, "model.dtype=bfloat16", "eval.limit=100"), checkpoint=run_dir
    )
    return {"accuracy": report.accuracy, **run_summary(records)}


def run_summary(records: list[dict]) -> dict[str, float]:
    """An RL run's training metrics over its step records."""

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in records if key in r]

    rewards = col("rollout/reward_mean")
    return {
        "steps": len(records),
        "reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
        "reward_last10": statistics.fmean(rewards[-10:]) if rewards else float("nan"),
        "reward_peak": max(rewards) if rewards else float("nan"),
        "ess_ratio_min": min(col("vcpo/ess_ratio") or [float("nan")]),
        "grad_norm_max": max(col("learner/grad_norm") or [float("nan")]),
        "mismatch_mean": statistics.fmean(col("rollout/logprob_mismatch_mean") or [float("nan")]),
        "mismatch_max": max(col("rollout/logprob_mismatch_max") or [float("nan")]),
        "agreement_mean": statistics.fmean(col("rollout/routing_agreement") or [float("nan")]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "moe_replay")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="a smoke run: small SFT, 1 seed, 4 RL steps")
    p.add_argument("--report", action="store_true",
                   help="run nothing: write the results from the cells done so far, naming the missing ones")  # fmt: skip
    results_args(p, "moe_replay")  # --quick without --out: --work, never the committed results
    args = p.parse_args(argv)
    if rewrite(args, "moe_replay", markdown):
        return 0
    if args.quick:
        args.seeds, args.steps, args.samples = 1, 4, 8
    torch.set_num_threads(1)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    prov = Provenance()
    compute = not args.report
    base, sft = work / "base", work / "sft"
    if compute:
        stage("1/4 tokenizer + random Qwen3-MoE")
        if not (base / "config.json").is_file():
            build_base(base)
        stage("2/4 SFT warm start on tiny_arith teacher traces")
        if not (sft / "config.json").is_file():
            warm_start(base, sft, work, args.quick)
        stage("3/4 mismatch and routing agreement, one learner step per cell")
    # one cell per dtype and replay (3 sampling seeds), one per replay and step count (--seeds seeds), run in the
    # harness's order and resumed from WORK/cells/runs.jsonl (benchmarks/harness/runner.py)
    runner, seeds = Runner(work / "cells"), range(args.seeds)
    mismatch_cells = {f"mismatch {d} {r}": (d, r) for d in DTYPES for r in REPLAYS}
    rl_cells = {f"rl {r} {args.steps} steps": r for r in REPLAYS}

    def one(job: Job) -> dict:
        if job.cell in mismatch_cells:
            return mismatch_cell(sft, *mismatch_cells[job.cell], job.seed, args.samples)
        replay = rl_cells[job.cell]
        return rl_cell(sft, work / f"rl_{replay}_{job.seed}", replay, job.seed, args.steps)

    if compute:
        runner.run(plan(list(mismatch_cells), range(3)), one, log)
        stage(f"4/4 RL at k=4 in bf16, replay off / on, {args.seeds} seeds")
        runner.run(plan(list(rl_cells), seeds), one, log)
    done = {
        k: {n: v for n, v in r.items() if n not in ("cell", "seed")}
        for k, r in read_runs(runner.path).items()
    }
    mismatch = [{"dtype": d, "replay": r, "seed": s, **done[key]} for (c, (d, r)) in mismatch_cells.items()
                for s in range(3) if (key := Job(c, s).key) in done]  # fmt: skip
    rl = [{"replay": r, "seed": s, **done[key]} for s in seeds for c, r in rl_cells.items() if (key := Job(c, s).key) in done]  # fmt: skip
    missing = [f"mismatch {d} replay={r} seed={s}" for c, (d, r) in mismatch_cells.items() for s in range(3)
               if Job(c, s).key not in done]  # fmt: skip
    missing += [
        f"RL replay={r} seed={s}" for s in seeds for c, r in rl_cells.items() if Job(c, s).key not in done
    ]
    write_results(args, mismatch, rl, prov, missing, partial_pairs(work, args.seeds, rl))
    return 0


def partial_pairs(work: Path, seeds: int, done: list[dict]) -> list[dict]:
    """Seeds whose off/rollout pair is not both done but both runs logged steps: each run's training metrics over
    the steps both have (no held-out accuracy: that is measured when a run ends)."""
    from agent_rl.metrics import read_metrics

    out = []
    for seed in range(seeds):
        if {r["replay"] for r in done if r["seed"] == seed} == {"off", "rollout"}:
            continue
        runs = {rp: work / f"rl_{rp}_{seed}" / "metrics.jsonl" for rp in ("off", "rollout")}
        if not all(f.is_file() for f in runs.values()):
            continue
        records = {
            rp: [r for r in read_metrics(f.parent) if "rollout/reward_mean" in r] for rp, f in runs.items()
        }
        n = min(len(v) for v in records.values())
        if n:
            out.append({"seed": seed, "steps": n, **{rp: run_summary(v[:n]) for rp, v in records.items()}})
    return out


def write_results(
    args: argparse.Namespace,
    mismatch: list[dict],
    rl: list[dict],
    prov: Provenance,
    missing: list[str],
    partial: list[dict],
) -> None:
    meta = prov.meta() | {"model": MODEL, "quick": args.quick, "missing": missing}
    out = args.out or (args.work if args.quick else OUT)  # a smoke run's figures stay out of the results
    data = {"meta": meta, "args": {k: str(v) for k, v in vars(args).items() if k not in ("from_results", "out")},
            "mismatch": mismatch, "rl": rl, "rl_partial": partial}  # fmt: skip
    write("moe_replay", data, out, markdown)


def _agg(rows: list[dict], key: str) -> str:
    """'mean ± SE' over the rows that have `key` (benchmarks/harness/stats.py; the mean alone from one row)."""
    m = mean_se(r[key] for r in rows if key in r)
    if m.mean is None:
        return "-"
    return f"{m.mean:.3g}" + (f" ± {m.se:.2g}" if m.se is not None else "")


def markdown(data: dict) -> str:
    """The results page, from the results JSON alone (so the committed page can be regenerated from its file)."""
    meta, args, mismatch, rl, partial = (
        data["meta"],
        data["args"],
        data["mismatch"],
        data["rl"],
        data["rl_partial"],
    )
    quick, missing = args["quick"] == "True", meta["missing"]
    when = (describe(meta) if "cpu" in meta  # written on the harness; before it, its own provenance fields
            else f"{meta['date']}, commit {meta['commit']}, {meta['machine']}, load {meta['load']:.1f}")  # fmt: skip
    lines = [
        f"# Routing replay on a small MoE ({when})",
        "",
        f"Qwen3-MoE, hidden 128, 2 layers, 8 experts top-2, SFT warm start on tiny_arith. Command: "
        f"`nice -n 15 .venv/bin/python benchmarks/moe_replay.py{' --quick' if quick else ''}`.",
        "",
        f"## Engine vs learner, one step on {args['samples']} first turns (mean ± SE over 3 sampling seeds)",
        "",
    ]  # fmt: skip
    keys = ("mismatch_mean", "mismatch_max", "mismatch_frac", "routing_agreement")
    rows = [[d, r, *(_agg([x for x in mismatch if (x["dtype"], x["replay"]) == (d, r)], k) for k in keys)]
            for d in DTYPES for r in REPLAYS]  # fmt: skip
    lines += table(
        ["dtype", "replay", "mismatch mean", "mismatch max", "share > 0.1", "routing agreement"], rows
    )
    keys = ("accuracy", "reward_last10", "ess_ratio_min", "grad_norm_max", "mismatch_mean", "agreement_mean")
    lines += ["", f"## RL in bf16 at k=4, {args['steps']} steps, {args['seeds']} seeds (mean ± SE; per-seed rows in the JSON)", "",
              *table(["replay", "held-out accuracy", "reward, last 10 steps", "min ESS ratio", "max grad norm",
                      "mismatch mean", "agreement"], [[r, *(_agg([x for x in rl if x["replay"] == r], k) for k in keys)]
                                                      for r in REPLAYS])]  # fmt: skip
    if partial:
        keys = (
            "reward_mean",
            "reward_last10",
            "ess_ratio_min",
            "grad_norm_max",
            "mismatch_mean",
            "agreement_mean",
        )
        lines += ["", "## RL runs not finished: each pair over the steps both logged (no held-out accuracy yet)", "",
                  *table(["seed", "steps", "replay", "reward mean", "reward, last 10", "min ESS ratio", "max grad norm",
                          "mismatch mean", "agreement"], [[p["seed"], p["steps"], r, *(f"{p[r][k]:.3g}" for k in keys)]
                                                          for p in partial for r in REPLAYS])]  # fmt: skip
    if missing:
        flags = "" if quick else f" --seeds {args['seeds']} --steps {args['steps']}"
        lines += ["", f"Not run yet ({len(missing)} cells): {'; '.join(missing)}. They run (and the rest are kept) "
                  f"with `nice -n 15 .venv/bin/python benchmarks/moe_replay.py{flags}`."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
