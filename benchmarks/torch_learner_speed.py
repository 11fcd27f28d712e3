"""Torch learner step against the transformers anchor: padded vs packed micro-batches, full vs chunked
log-probs, torch.compile on/off.

    nice -n 15 .venv/bin/python benchmarks/torch_learner_speed.py [--quick] [--repeats 2] [--smollm DIR]
        [--smollm-lengths 512 1024] [--smollm-repeats 2]

One VCPO step (proxy OPOB, whole groups per micro-batch) of `TorchRank`, each cell in a fresh subprocess
(peak RSS is that process's), one torch thread, the same weights and batch in every cell of a size:
- tiny: the test suite's tiny Qwen2 (2 layers, hidden 128, vocab 512), 2 groups x 4 trajectories whose
  lengths are L, 3L/4, L/2, L/4 tokens for L = 1k, 2k, 4k, 8k (what multi-turn lengths look like: a
  micro-batch of one group padded to its longest row is 37.5 % padding);
- smollm2: SmolLM2-135M-Instruct (`agent-rl prepare smollm2 --out DIR`, 30 layers, hidden 576, vocab
  49152, tied embeddings), 1 group x 4 trajectories at L = 512 and 1024 (`--smollm-lengths`; no compile cell: compiling the
  30-layer decoder takes longer than the rest of the run on 2 shared cores).
Variants: `anchor` = what a user gets from the well-kept stack (issue 33's anchor, on CPU): a transformers
training step on the same batch and micro-batches (right-padded rows, `attn_implementation="sdpa"`,
`labels` with -100 off the sampled tokens so transformers' own `ForCausalLMLoss` computes the loss, fp32,
fused AdamW). Liger's fused linear cross-entropy is not in it: liger-kernel's kernels are Triton GPU kernels
with no CPU path (linkedin/Liger-Kernel#51: "completely triton based"; Triton ships no CPU backend), so on CPU the anchor is transformers' own loss (the [tokens, vocab] logits upcast to fp32).
The anchor computes less than a VCPO step (no importance ratios, no OPOB Σp²): a ratio >= 1 means the
learner's extra work is paid for. `old` = right-padded rows, the model's [B, T, vocab] logits log-softmaxed whole in fp32 (the
learner's log-probs before this change, copied here as `_old_logprobs`); `padded+chunked`;
`packed+chunked` (the default now); `packed+chunked+compile` (at the smallest and largest size only:
compiling takes minutes per process on 2 cores). Tokens/s counts real tokens over the step's CPU seconds
(this process's, robust to other load on a shared machine; wall seconds too), median of `--repeats`
steps after one warm-up step (which includes compiling, reported apart). `--report-only` writes the report
from the cells measured so far. Cells already in benchmarks/results/torch_learner_speed.partial.json are not rerun (resumable);
writes benchmarks/results/torch_learner_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_paths import portable

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
PARTIAL = OUT / "torch_learner_speed.partial.json"
MODELS = ROOT / "runs" / "bench_models"
VARIANTS = {  # name -> (pack, logprob_chunk_tokens, compile); "old" swaps in the log-probs of before (below)
    "anchor": (False, 0, False),  # transformers' own training step (run_anchor), not the learner
    "old": (False, 1024, False),
    "padded+chunked": (False, 1024, False),
    "packed+chunked": (True, 1024, False),
    "packed+chunked+compile": (True, 1024, True),
}


def _old_logprobs(model, input_ids, attention_mask, proxy=False):
    """The torch learner's log-probs before this change (vcpo/logprobs.py at b8d4f92): the model's [B, T, V]
    logits for right-padded rows, upcast to fp32 and log-softmaxed whole."""
    import torch

    logits = model(input_ids).logits[:, :-1].float()
    logp_all = logits.log_softmax(-1)
    lp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    out = lp.new_zeros(input_ids.shape)
    out[:, 1:] = lp
    if not proxy:
        return out
    with torch.no_grad():
        gsq = out.new_zeros(input_ids.shape)
        gsq[:, 1:] = (1.0 - 2.0 * lp.exp() + logp_all.mul(2.0).exp_().sum(-1)).clamp(min=0.0)
    return out, gsq


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _anchor_step(cell: dict):
    """The anchor: a transformers training step (SDPA, `labels` -> transformers' `ForCausalLMLoss`, fused AdamW)
    over the learner's micro-batches (rows of `micro_batch_size`, trailing padding cut as the learner does)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        cell["model_dir"], attn_implementation="sdpa", dtype=torch.float32
    )
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, fused=True)

    def step(batch, micro_batch_size: int = 4) -> None:
        opt.zero_grad(set_to_none=True)
        n = batch.size
        for lo in range(0, n, micro_batch_size):
            mb = batch.select(torch.arange(lo, min(lo + micro_batch_size, n)))
            labels = mb.input_ids.masked_fill(mb.loss_mask <= 0, -100)
            out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=labels)
            (out.loss * (mb.size / n)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return model, opt, step


def run_cell(cell: dict) -> dict:
    """In the subprocess: build the rank, step once to warm up, then `repeats` timed steps from the same state."""
    import torch

    from agent_rl.batch import collate
    from agent_rl.learners._torch_rank import RankSpec, TorchRank
    from agent_rl.types import Group, Trajectory
    from vcpo import StepConfig

    torch.set_num_threads(1)
    pack, chunk, compile_ = VARIANTS[cell["variant"]]
    spec = RankSpec(
        model_path=cell["model_dir"], weights_dtype="float32", compute_dtype="float32", lr=1e-6,
        betas=(0.9, 0.999), weight_decay=0.0, lr_schedule="constant", warmup_steps=0, total_steps=1000,
        gradient_checkpointing=False, seed=0,
        step=StepConfig(loss="vcpo", advantage="opob", opob_mode="proxy", micro_batch_size=4),
        pack=pack, logprob_chunk_tokens=chunk, compile=compile_,
    )  # fmt: skip
    if cell["variant"] == "anchor":
        model, optimizer, step = _anchor_step(cell)
    else:
        rank = TorchRank(spec)
        model, optimizer, step = rank.model, rank.optimizer, rank.step
    if cell["variant"] == "old":
        rank._lp.logprobs = _old_logprobs  # type: ignore[method-assign]
        rank._lp.proxy = lambda m, i, a: _old_logprobs(m, i, a, proxy=True)  # type: ignore[method-assign]
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    groups = []
    for gi in range(cell["groups"]):
        prompt = torch.randint(3, vocab, (64,), generator=g).tolist()
        trajs = []
        for i, frac in enumerate((1.0, 0.75, 0.5, 0.25)):
            n = int(cell["length"] * frac) - len(prompt)
            t = Trajectory(uid=f"{gi}-{i}", group_id=f"g{gi}", prompt_ids=prompt, reward=float(i % 2))
            t.append_sampled(
                torch.randint(3, vocab, (n,), generator=g).tolist(), (-torch.rand(n, generator=g)).tolist(), 0
            )
            trajs.append(t)
        groups.append(Group(f"g{gi}", trajs))
    batch = collate(groups, sort_by_length=True).policy
    tokens = int(batch.attention_mask.sum())
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt_init = optimizer.state_dict()
    rss_before = _rss_mib()
    cpu, wall = [], []
    for _ in range(cell["repeats"] + 1):
        model.load_state_dict(init)
        optimizer.load_state_dict(opt_init)
        t0, c0 = time.perf_counter(), time.process_time()
        step(batch)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {
        "tokens": tokens,
        "padded_tokens": int(batch.input_ids.numel()),
        "warmup_wall_s": wall[0],
        "median_cpu_s": statistics.median(cpu[1:]),
        "median_wall_s": statistics.median(wall[1:]),
        "cpu_s": cpu[1:],
        "tokens_per_cpu_s": tokens / statistics.median(cpu[1:]),
        "rss_before_step_mib": rss_before,
        "peak_rss_mib": peak,
        "step_peak_over_model_mib": peak - rss_before,
    }


def _cells(args: argparse.Namespace, tiny: Path, smollm: Path | None) -> list[dict]:
    sizes = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192]
    cells = [
        {
            "model": "tiny",
            "model_dir": str(tiny),
            "length": n,
            "groups": 2,
            "variant": v,
            "repeats": args.repeats,
        }
        for n in sizes
        for v in VARIANTS
        if "compile" not in v or n in (sizes[0], sizes[-1])  # compiling takes minutes per process here
    ]
    if smollm is not None:
        for n in args.smollm_lengths:
            cells += [
                {
                    "model": "smollm2",
                    "model_dir": str(smollm),
                    "length": n,
                    "groups": 1,
                    "variant": v,
                    "repeats": args.smollm_repeats,
                }  # fmt: skip
                for v in ("anchor", "old", "packed+chunked")  # compile: tens of minutes per process here
            ]
    return cells


def _key(cell: dict) -> str:
    return f"{cell['model']}/{cell['length']}/{cell['variant']}/r{cell['repeats']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny: 1k and 2k tokens only")
    ap.add_argument("--smollm", type=Path, default=None, help="a prepared SmolLM2 dir (default: prepare one)")
    ap.add_argument("--no-smollm", action="store_true")
    ap.add_argument("--smollm-lengths", type=int, nargs="+", default=[512, 1024], help="longest trajectory L")
    ap.add_argument("--smollm-repeats", type=int, default=2, help="timed steps per smollm2 cell")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="write the report from the cells measured so far (the rest: not run)",
    )
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        print(json.dumps(run_cell(json.loads(args.cell))))
        return
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    tiny = MODELS / "tiny_speed"
    if not (tiny / "config.json").is_file():
        build_tiny(tiny, sample_corpus(), vocab_size=512, seed=0, max_positions=8192)
    smollm = None
    if not args.no_smollm:
        from agent_rl.tools.pretrained import prepare_smollm2

        smollm = prepare_smollm2(args.smollm or MODELS / "smollm2")
    done: dict[str, dict] = json.loads(PARTIAL.read_text()) if PARTIAL.is_file() else {}
    cells = _cells(args, tiny, smollm)
    for i, cell in enumerate([] if args.report_only else cells):
        key = _key(cell)
        if key in done:
            continue
        print(f"[{time.strftime('%H:%M:%S')}] {i + 1}/{len(cells)} {key}", flush=True)
        out = subprocess.run(
            [sys.executable, __file__, "--cell", json.dumps(cell)], capture_output=True, text=True, cwd=ROOT
        )
        if out.returncode != 0:
            tail = out.stderr.strip().splitlines()[-3:]
            done[key] = {"cell": cell, "error": " | ".join(tail)}
            print(f"  failed: {done[key]['error']}", flush=True)
        else:
            done[key] = {"cell": cell, **json.loads(out.stdout.strip().splitlines()[-1])}
            r = done[key]
            print(
                f"  {r['tokens_per_cpu_s']:.0f} tok/cpu-s, peak RSS {r['peak_rss_mib']:.0f} MiB", flush=True
            )
        OUT.mkdir(parents=True, exist_ok=True)
        PARTIAL.write_text(portable(json.dumps(done, indent=1)))
    write_report(
        {
            _key(c): done.get(_key(c), {"cell": c, "error": "not run (--report-only before it ran)"})
            for c in cells
        },
        args,
    )


def write_report(results: dict[str, dict], args: argparse.Namespace) -> None:
    """benchmarks/results/torch_learner_speed.{json,md}."""
    import torch

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.platform(),
        "cpu_count": __import__("os").cpu_count(),
        "torch": torch.__version__,
        "torch_threads": 1,
        "repeats": args.repeats,
        "smollm_repeats": args.smollm_repeats,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip(),
    }  # fmt: skip
    report = {"config": meta, "cells": results, "ratios": ratios(results)}
    (OUT / "torch_learner_speed.json").write_text(portable(json.dumps(report, indent=2)))
    md = markdown(report)
    (OUT / "torch_learner_speed.md").write_text(md)
    print(md)


def ratios(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each cell's tokens/s and step memory over those of the `anchor` and of `old` of the same model and size."""
    out: dict[str, dict[str, float]] = {}
    for key, r in results.items():
        if "error" in r or r["cell"]["variant"] == "anchor":
            continue
        for ref_name in ("anchor", "old"):
            ref = results.get(_key({**r["cell"], "variant": ref_name}))
            if ref is None or "error" in ref or r["cell"]["variant"] == ref_name:
                continue
            out.setdefault(key, {}).update({
                f"tokens_per_s_vs_{ref_name}": r["tokens_per_cpu_s"] / ref["tokens_per_cpu_s"],
                f"step_memory_vs_{ref_name}": r["step_peak_over_model_mib"] / max(ref["step_peak_over_model_mib"], 1e-9),
            })  # fmt: skip
    return out


def markdown(report: dict) -> str:
    """The results page, from the JSON alone (tests/test_docs_results.py renders it again)."""
    meta, results, rat = report["config"], report["cells"], report["ratios"]
    rows = []
    for key, r in results.items():
        c = r["cell"]
        if "error" in r:
            msg = r["error"] if r["error"].startswith("not run") else f"failed: {r['error'][:80]}"
            rows.append(f"| {c['model']} | {c['length']} | {c['variant']} | {msg} | | | | | | | |")
            continue
        q = rat.get(key, {})

        def x(name: str, q=q) -> str:
            return f"{q[name]:.2f}x" if name in q else ""

        rows.append(
            f"| {c['model']} | {c['length']} | {c['variant']} | {r['tokens_per_cpu_s']:.0f} | "
            f"{x('tokens_per_s_vs_anchor')} | {x('tokens_per_s_vs_old')} | {r['peak_rss_mib']:.0f} | "
            f"{r['step_peak_over_model_mib']:.0f} | {x('step_memory_vs_anchor')} | {x('step_memory_vs_old')} | "
            f"{r['warmup_wall_s']:.1f} |"
        )
    md = [
        "# Torch learner step against a transformers training step: packing, chunked log-probs, torch.compile",
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['machine']}, torch {meta['torch']}, 1 torch thread, "
        f"median of {meta['repeats']} steps (smollm2: {meta['smollm_repeats']}) after a warm-up; one VCPO step "
        "(proxy OPOB, a group per micro-batch), each cell a fresh process. `benchmarks/torch_learner_speed.py`.",
        "",
        "Tokens/s = real tokens / CPU seconds of the step. Step memory = peak RSS minus RSS after the model and "
        "optimizer were built. Ratios against the `anchor` (a transformers training step: SDPA, transformers' own "
        "loss, fused AdamW; Liger has no CPU kernels) and against `old` (the learner before: padded rows, whole "
        "fp32 log-softmax), same batch and size.",
        "",
        "| model | tokens per trajectory (longest) | variant | tokens/s | vs anchor | vs old | peak RSS MiB | "
        "step memory MiB | vs anchor | vs old | warm-up step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    return "\n".join(md)


if __name__ == "__main__":
    main()
