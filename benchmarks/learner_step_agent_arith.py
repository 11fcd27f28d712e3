"""The torch learner's step at agent_arith's shapes (benchmarks/vs_trl.py's job): where its time goes, and each
change to it measured against the code it replaced, in one process, cases interleaved round by round.

    .venv/bin/python benchmarks/learner_step_agent_arith.py [--repeats 8] [--threads 1] [--profile]

The model is agent_arith's (examples/agent_arith.py: its tokenizer and a Qwen2 of hidden 256, 2 layers, 4 heads,
2 kv heads, vocab ~340; random weights, which do not change the time), the batch one step of recipes/agent_arith.yaml:
8 prompts x 8 samples of teacher traces rendered as the gateway renders them, 3 in 8 calling the tool (the share in
vs_trl's runs' first steps), 3935 tokens in all (vs_trl's first steps: 4.3k); VCPO with proxy OPOB, lr 2e-4, grad clip 1.
Micro-batch 64 (vs_trl's tuned agent-rl cells: one forward and backward for the whole step) unless --micro-batch.

Cases (the baseline is the code before the change, kept here as the reference it is measured against):
- `before`: packed attention as it was: each document's q/k/v sliced out of the packed row, one SDPA call per
  document (`slice_per_document`). A slice's backward writes its gradient into a zero tensor the size of the whole
  packed row, one per document, which autograd then sums: O(documents x tokens).
- `now`: the documents cut from the packed row with one split (its backward is one cat), consecutive documents of
  one length as one batched SDPA call (proxy OPOB hands a micro-batch over group by group, each group sorted longest
  first: a group's members of one length are neighbours). The same arithmetic on the same values.
  (Packing the rows longest first as well, so that every document of one length joins one call, measured 0.994x of
  this in CPU time, 0.89-1.12 over 24 rounds: not kept.)
- `now, common prefixes shared` (learner.share_prefixes, on by default since): a group's 8 samples run their prompt
  once (agent_rl/learners/shared_prefix.py); against `now`. Also at micro-batch 4, against `now` at 4.

Times are this process's CPU seconds and wall seconds of one `TorchRank.step`; a ratio is the median of the
per-round ratios (case / its baseline), with its min and max over rounds. The machine is shared: the load average is
written before and after. `--profile`: also torch.profiler's top operators of the code now and before (3 steps each).
Also, the code now at other settings, each against the code now at micro-batch 64: micro-batch 8 (one group per
forward and backward) and 4 (learner.micro_batch_size's default: proxy OPOB then runs a forward without gradients over
each group of 8 first), rounding only; and bf16 autocast (learner.dtype: bfloat16), which changes the numerics beyond
rounding order: a separate cell, never a default (issue 62's acceptance). `--code-only`: only the code cases (before, now, shared).
Writes benchmarks/results/learner_step_agent_arith.{json,md} (`_2threads` with --threads 2).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_paths  # noqa: E402, F401  (puts the checkout on sys.path)

from agent_rl.learners._torch_rank import RankSpec, TorchRank  # noqa: E402
from benchmarks.harness.provenance import Provenance, describe  # noqa: E402
from benchmarks.harness.report import quick_args, results_dir, results_file, table, write  # noqa: E402
from benchmarks.harness.stats import spread  # noqa: E402
from benchmarks.learner_step import time_rounds  # noqa: E402
from vcpo import PolicyBatch, StepConfig  # noqa: E402

BEFORE, NOW = "before", "now (one split, runs of one length batched)"
MB8, MB4 = (
    "now, micro-batch 8 (a group per forward)",
    "now, micro-batch 4 (learner.micro_batch_size's default)",
)
MB4_HOLD = "now, micro-batch 4, the group's graphs held (no forward without gradients)"
BF16 = "now, bf16 autocast (other numerics: a separate cell, not a default)"
SHARED = "now, common prefixes shared (learner.share_prefixes)"
SHARED_MB4 = "now, micro-batch 4, common prefixes shared"
BASE = {
    NOW: (BEFORE,),
    SHARED: (NOW,),
    MB8: (NOW,),
    MB4: (NOW,),
    SHARED_MB4: (MB4,),
    MB4_HOLD: (NOW,),
    BF16: (NOW,),
}
"""each case's ratios are taken against these (the micro-batches and bf16 against the code now at micro-batch 64)"""
TOOL_RATE = 24 / 64  # trajectories calling the tool at vs_trl's first agent-rl step (batches.jsonl)


def slice_per_document(
    module, query, key, value, attention_mask, cu_seq_lens_q=None, packed_bounds=None, **kw
):
    """packed_attention._attention as it was before the split (the reference of `before`)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (cu_seq_lens_q is None and packed_bounds is None) or attention_mask is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    bounds = list(packed_bounds) if packed_bounds is not None else cu_seq_lens_q.tolist()
    parts = [
        sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, **kw)[0]
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(parts, dim=1), None


def use_reference(reference: bool) -> None:
    """Switch packed attention between the code before and now (transformers' registry: every model at once)."""
    from transformers import AttentionInterface

    from agent_rl.learners import packed_attention

    AttentionInterface.register(
        packed_attention.NAME, slice_per_document if reference else packed_attention._attention
    )


def build(work: Path) -> Path:
    """agent_arith's tokenizer and model shapes (examples/agent_arith.build_base), random weights."""
    from examples import agent_arith

    base = work / "base"
    agent_arith.build_base(base)
    return base


def agent_arith_batch(model_dir: Path, seed: int = 0, groups: int = 8, per_group: int = 8) -> PolicyBatch:
    """One step's batch: per prompt, `per_group` teacher traces of one task rendered as the gateway renders them
    (examples/agent_arith.chat_row), TOOL_RATE of them calling the tool; behaviour log-probs drawn near the
    model's, rewards alternating within a group (every group has a signal)."""
    from transformers import AutoTokenizer

    from agent_rl.batch import collate
    from agent_rl.types import Group, Trajectory
    from envs.tiny_arith import make_tasks, teacher_trace
    from examples.agent_arith import chat_row

    tok = AutoTokenizer.from_pretrained(model_dir)
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    out = []
    for gi, task in enumerate(make_tasks(groups, seed + 1000, 0.25)):
        trajs = []
        for i in range(per_group):
            row = chat_row(tok, teacher_trace(task, rng, TOOL_RATE))
            t = Trajectory(
                uid=f"{gi}-{i}",
                group_id=f"g{gi}",
                prompt_ids=tok(row["prompt"])["input_ids"],
                reward=float(i % 2),
            )
            for piece in row["response"]:
                ids = tok(piece["text"], add_special_tokens=False)["input_ids"]
                if piece["train"]:
                    t.append_sampled(ids, (-0.5 * torch.rand(len(ids), generator=g)).tolist(), 0)
                else:
                    t.append_env(ids)
            trajs.append(t)
        out.append(Group(f"g{gi}", trajs))
    return collate(out, sort_by_length=True).policy


def rank(
    model_dir: Path, micro_batch: int, dtype: str = "float32", hold: bool = False, share: bool = False
) -> TorchRank:
    """recipes/agent_arith.yaml's learner and algorithm (fp32, packed), the given micro-batch (and autocast dtype);
    common prefixes shared only with `share` (learner.share_prefixes: every other case measures the code before it)."""
    step = StepConfig(loss="vcpo", advantage="opob", opob_mode="proxy", ess_lr_rule="sqrt", is_truncation=8.0,
                      grad_clip=1.0, micro_batch_size=micro_batch, proxy_hold_group=hold)  # fmt: skip
    return TorchRank(
        RankSpec(model_path=str(model_dir), weights_dtype="float32", compute_dtype=dtype, lr=2e-4,
                 betas=(0.9, 0.999), weight_decay=0.0, lr_schedule="constant", warmup_steps=0, total_steps=1000,
                 gradient_checkpointing=False, step=step, seed=0, share_prefixes=share)
    )  # fmt: skip


Case = tuple[TorchRank, Callable[[], None]]


def rounds(cases: dict[str, Case], batch: PolicyBatch, repeats: int) -> dict[str, dict[str, list[float]]]:
    """CPU and wall seconds of each case's step per round and the load after it (benchmarks/learner_step.py
    `time_rounds`: cases rotated round by round, round 0 a warm-up, every step from the same weights and optimizer
    state)."""
    return time_rounds({n: (rk, batch, setup) for n, (rk, setup) in cases.items()}, repeats)


def ratios(res: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per case and clock: the per-round ratios case / its BASE case, their median, min and max."""
    out = {}
    for name, bases in BASE.items():
        for base in bases:
            if name not in res or base not in res:
                continue
            for clock in ("cpu", "wall"):
                per = [a / b for a, b in zip(res[name][f"{clock}_s"], res[base][f"{clock}_s"], strict=True)]
                out[f"{name} / {base} ({clock})"] = spread(per) | {"rounds": per}
    return out


def profile(rk: TorchRank, batch: PolicyBatch, steps: int = 3) -> list[dict[str, Any]]:
    """torch.profiler's operators by self CPU time over `steps` steps (per step, ms), the top 15."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    rk.step(batch)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            rk.step(batch)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        {"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps, "share": e.self_cpu_time_total / total,
         "calls_per_step": e.count / steps}
        for e in events[:15]
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the k=2 learner process has 1)")
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--code-only", action="store_true", help="only the code cases: before, now, shared")
    ap.add_argument(
        "--from-results", type=results_file, default=None, help="run nothing: rewrite FILE's ratios and page"
    )
    ap.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results)")
    quick_args(ap, repeats=1, code_only=True)
    args = ap.parse_args(argv)
    if args.from_results is not None:
        d = json.loads(args.from_results.read_text())
        write(
            args.from_results.stem,
            d | {"ratios": ratios(d["cases"])},
            args.out or args.from_results.parent,
            markdown,
        )
        return
    out = results_dir(args.out, scratch=args.quick, name="learner_step_agent_arith")
    name = "learner_step_agent_arith" + ("" if args.threads == 1 else f"_{args.threads}threads")
    prov = Provenance()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        model_dir = build(Path(d))
        batch = agent_arith_batch(model_dir)
        rk = rank(model_dir, args.micro_batch)
        cases: dict[str, Case] = {
            BEFORE: (rk, lambda: use_reference(True)),
            NOW: (rk, lambda: use_reference(False)),
            SHARED: (rank(model_dir, args.micro_batch, share=True), lambda: use_reference(False)),
        }
        if not args.code_only:
            now = {
                MB8: rank(model_dir, 8),
                MB4: rank(model_dir, 4),
                SHARED_MB4: rank(model_dir, 4, share=True),
                MB4_HOLD: rank(model_dir, 4, hold=True),
                BF16: rank(model_dir, args.micro_batch, "bfloat16"),
            }
            cases |= {n: (r, lambda: use_reference(False)) for n, r in now.items()}
        res = rounds(cases, batch, args.repeats)
        prof = None
        if args.profile:
            use_reference(True)
            prof_before = profile(rk, batch)
            use_reference(False)
            prof = {"now": profile(rk, batch), "before": prof_before}
        use_reference(False)
        shape = {"rows": batch.size, "tokens": int(batch.attention_mask.sum()), "loss_tokens": int(batch.loss_mask.sum()),
                 "lengths": sorted(batch.attention_mask.sum(-1).tolist(), reverse=True),
                 "vocab": rk.model.config.vocab_size}  # fmt: skip
    d = {
        "meta": prov.meta(),
        "config": {
            "repeats": args.repeats,
            "threads": args.threads,
            "micro_batch": args.micro_batch,
            "batch": shape,
        },
        "cases": res,
        "median": {n: {k: statistics.median(r[f"{k}_s"]) for k in ("cpu", "wall")} for n, r in res.items()},
        "ratios": ratios(res),
        "profile": prof,
    }
    write(name, d, out, markdown)


def markdown(d: dict) -> str:
    c, b = d["config"], d["config"]["batch"]
    rows = [[n, f"{m['cpu']:.3f}", f"{m['wall']:.3f}"] for n, m in d["median"].items()]
    rat = [[k, f"{v['median']:.3f}", f"{v['min']:.3f} - {v['max']:.3f}"] for k, v in d["ratios"].items()]
    lines = [
        "# Torch learner step at agent_arith's shapes: each change against the code before it", "",
        f"{describe(d['meta'])}; {c['threads']} torch thread(s), micro-batch {c['micro_batch']}, {c['repeats']} rounds "
        f"(cases interleaved, order rotated); batch {b['rows']} trajectories, {b['tokens']} tokens ({b['loss_tokens']} "
        f"trained), vocab {b['vocab']}. The machine is shared (load average per round in the JSON): read the ratios, "
        "not the seconds.", "",
        *table(["case", "CPU s (median)", "wall s (median)"], rows), "",
        *table(["ratio (per round, median)", "median", "min - max"], rat), "",
    ]  # fmt: skip
    for which, title in (("now", "the code now"), ("before", "the code before")):
        if not (prof := (d.get("profile") or {}).get(which)):
            continue
        rows = [[p["op"][:60], f"{p['self_ms_per_step']:.1f}", f"{100 * p['share']:.1f} %", f"{p['calls_per_step']:.0f}"]
                for p in prof]  # fmt: skip
        lines += [f"Where the step of {title} goes (torch.profiler, self CPU time per step, top 15 operators):", "",
                  *table(["operator", "ms / step", "share", "calls / step"], rows), ""]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
