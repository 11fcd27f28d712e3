"""Torch learner step cost: row order (padding) and micro-batch size versus group size.

    .venv/bin/python benchmarks/learner_step.py [--repeats 5]

Two comparisons on the tiny Qwen2 of the test suite, one torch thread, every case stepping
from the same weights (restored before each step), cases interleaved round by round:
1. Padding. A micro-batch is padded to its longest row, and multi-turn lengths differ
   several-fold. The learner sorts each rank's rows longest first; here GRPO-style REINFORCE,
   micro-batch 4, 8 prompts x 4 samples, lengths 48-768: arrival order vs sorted.
2. Micro-batch vs group size. VCPO's proxy baseline needs a whole group's log-probs before
   its backward pass; a group larger than the micro-batch costs an extra forward-only pass.
   4 prompts x 8 samples (tiny_arith's group size), lengths 48-256: micro-batch 4 vs 8.
3. Exact OPOB's norms (`--cases opob`): at the main job's shapes (recipes/tiny_tir.yaml: the model of
   examples/tiny_tir.py, hidden 256, 2 layers, vocab 512; 8 prompts x 8 samples, lengths 48-256, micro-batch 4,
   fp32), exact OPOB with ghost norms (vcpo/ghost.py) vs one backward per trajectory vs proxy OPOB (what the
   main job runs). Writes benchmarks/results/learner_step_opob.{json,md}, with the load average (shared machine).
Times are this process's CPU seconds (robust to other load on a shared machine) and wall
seconds, medians. Writes benchmarks/results/learner_step.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agent_rl.batch import collate
from agent_rl.learners._torch_rank import RankSpec, TorchRank
from agent_rl.tools.tiny import build_tiny, sample_corpus
from agent_rl.types import Group, Trajectory
from vcpo import PolicyBatch, StepConfig

OUT = Path(__file__).resolve().parent / "results"


def make_groups(vocab: int, groups: int, per_group: int, lo: int, hi: int) -> list[Group]:
    g = torch.Generator().manual_seed(0)
    out = []
    for gi in range(groups):
        prompt = torch.randint(3, vocab, (24,), generator=g).tolist()
        trajs = []
        for i in range(per_group):
            n = int(torch.randint(lo, hi + 1, (1,), generator=g))
            t = Trajectory(uid=f"{gi}-{i}", group_id=f"g{gi}", prompt_ids=prompt, reward=float(i % 2))
            t.append_sampled(
                torch.randint(3, vocab, (n,), generator=g).tolist(), (-torch.rand(n, generator=g)).tolist(), 0
            )
            trajs.append(t)
        out.append(Group(f"g{gi}", trajs))
    return out


def padding_fraction(batch: PolicyBatch, mbs: int) -> float:
    """Share of computed positions that are padding, for consecutive row chunks of `mbs`."""
    lengths = batch.attention_mask.sum(-1).tolist()
    computed = sum(len(c) * max(c) for c in (lengths[i : i + mbs] for i in range(0, len(lengths), mbs)))
    return 1 - sum(lengths) / computed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--cases", choices=["all", "opob"], default="all", help="opob: the exact-OPOB norms cell only"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cases == "opob":
        opob_norms(args.repeats)
        return
    grpo = dict(loss="reinforce", advantage="grpo", ess_lr_rule="none")
    proxy = dict(loss="vcpo", advantage="opob", opob_mode="proxy")
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny(d, sample_corpus(), vocab_size=512, seed=0, max_positions=1024)

        def rank(mbs: int, **cfg: object) -> TorchRank:
            return TorchRank(
                RankSpec(
                    model_path=str(model_dir), weights_dtype="float32", compute_dtype="float32", lr=1e-5,
                    betas=(0.9, 0.999), weight_decay=0.0, lr_schedule="constant", warmup_steps=0,
                    total_steps=1000, gradient_checkpointing=False, step=StepConfig(micro_batch_size=mbs, **cfg),
                    seed=0,
                )
            )  # fmt: skip

        r4, p4, p8 = rank(4, **grpo), rank(4, **proxy), rank(8, **proxy)
        vocab = r4.model.config.vocab_size
        long_groups, tir_groups = make_groups(vocab, 8, 4, 48, 768), make_groups(vocab, 4, 8, 48, 256)
        sorted_tir = collate(tir_groups, sort_by_length=True).policy
        cases = {
            "grpo, mbs 4, arrival order": (r4, collate(long_groups).policy, 4),
            "grpo, mbs 4, sorted by length": (r4, collate(long_groups, sort_by_length=True).policy, 4),
            "vcpo proxy, group 8, mbs 4": (p4, sorted_tir, 4),
            "vcpo proxy, group 8, mbs 8": (p8, sorted_tir, 8),
        }
        init = {k: v.clone() for k, v in r4.model.state_dict().items()}
        opt_init = {id(r): r.optimizer.state_dict() for r in (r4, p4, p8)}
        wall: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        for rnd in range(args.repeats + 1):  # round 0 warms up
            for name, (rk, batch, _) in cases.items():
                rk.model.load_state_dict(init)
                rk.optimizer.load_state_dict(opt_init[id(rk)])
                t0, c0 = time.perf_counter(), time.process_time()
                rk.step(batch)
                if rnd:
                    wall[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
            print(f"[{time.strftime('%H:%M:%S')}] round {rnd} done", flush=True)
    res: dict[str, dict[str, float]] = {
        name: {
            "median_cpu_s": statistics.median(cpu[name]),
            "median_wall_s": statistics.median(wall[name]),
            "padding_fraction": padding_fraction(batch, mbs),
        }
        for name, (_, batch, mbs) in cases.items()
    }
    names = list(cases)
    ratios = {
        "sorted / arrival (cpu)": res[names[1]]["median_cpu_s"] / res[names[0]]["median_cpu_s"],
        "sorted / arrival (wall)": res[names[1]]["median_wall_s"] / res[names[0]]["median_wall_s"],
        "mbs 8 / mbs 4 (cpu)": res[names[3]]["median_cpu_s"] / res[names[2]]["median_cpu_s"],
        "mbs 8 / mbs 4 (wall)": res[names[3]]["median_wall_s"] / res[names[2]]["median_wall_s"],
    }
    meta = {"repeats": args.repeats, "torch_threads": 1, "machine": platform.platform()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "learner_step.json").write_text(
        json.dumps({"config": meta, "cases": res, "ratios": ratios}, indent=2)
    )
    md = [
        "# Torch learner step: padding and micro-batch size",
        "",
        f"median of {args.repeats}, 1 torch thread; {meta['machine']}",
        "",
        "| case | CPU s | wall s | padding fraction |",
        "|---|---|---|---|",
        *(
            f"| {n} | {r['median_cpu_s']:.2f} | {r['median_wall_s']:.2f} | {r['padding_fraction']:.2f} |"
            for n, r in res.items()
        ),
        "",
        *(f"- {k}: **{v:.2f}**" for k, v in ratios.items()),
        "",
    ]
    (OUT / "learner_step.md").write_text("\n".join(md))
    print("\n".join(md))


def opob_norms(repeats: int) -> None:
    """Cell 3: exact OPOB with ghost norms vs a backward per trajectory vs proxy OPOB, main job's shapes."""
    import os

    cases_cfg = {
        "exact OPOB, ghost norms": dict(opob_mode="exact", opob_norms="ghost"),
        "exact OPOB, ghost norms, group's graphs held": dict(
            opob_mode="exact", opob_norms="ghost", proxy_hold_group=True
        ),
        "exact OPOB, ghost norms, micro-batch 8 (a group per forward)": dict(
            opob_mode="exact", opob_norms="ghost", micro_batch_size=8
        ),
        "exact OPOB, backward per trajectory": dict(opob_mode="exact", opob_norms="backward"),
        "proxy OPOB (main job)": dict(opob_mode="proxy"),
    }
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny(
            d, sample_corpus(), vocab_size=512, seed=0, hidden=256, layers=2, heads=4, kv_heads=2
        )
        ranks = {
            name: TorchRank(
                RankSpec(
                    model_path=str(model_dir), weights_dtype="float32", compute_dtype="float32", lr=1e-5,
                    betas=(0.9, 0.999), weight_decay=0.0, lr_schedule="constant", warmup_steps=0, total_steps=1000,
                    gradient_checkpointing=False, step=StepConfig(**({"micro_batch_size": 4} | cfg)), seed=0,
                )
            )
            for name, cfg in cases_cfg.items()
        }  # fmt: skip
        first = next(iter(ranks.values()))
        batch = collate(make_groups(first.model.config.vocab_size, 8, 8, 48, 256), sort_by_length=True).policy
        init = {k: v.clone() for k, v in first.model.state_dict().items()}
        opt_init = {name: r.optimizer.state_dict() for name, r in ranks.items()}
        wall: dict[str, list[float]] = {k: [] for k in ranks}
        cpu: dict[str, list[float]] = {k: [] for k in ranks}
        for rnd in range(repeats + 1):  # round 0 warms up
            for name, rk in ranks.items():
                rk.model.load_state_dict(init)
                rk.optimizer.load_state_dict(opt_init[name])
                t0, c0 = time.perf_counter(), time.process_time()
                rk.step(batch)
                if rnd:
                    wall[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
            load.append(os.getloadavg())
            print(f"[{time.strftime('%H:%M:%S')}] round {rnd} done, load {load[-1][0]:.1f}", flush=True)
    res = {n: {"median_cpu_s": statistics.median(cpu[n]), "median_wall_s": statistics.median(wall[n]),
               "cpu_s": cpu[n], "wall_s": wall[n]} for n in ranks}  # fmt: skip
    ghost, held, mb8, backward, proxy = (res[n]["median_cpu_s"] for n in cases_cfg)
    ratios = {"ghost / backward (cpu)": ghost / backward, "ghost / proxy (cpu)": ghost / proxy,
              "ghost held / backward (cpu)": held / backward, "ghost mbs 8 / backward (cpu)": mb8 / backward,
              "backward / proxy (cpu)": backward / proxy}  # fmt: skip
    meta = {"repeats": repeats, "torch_threads": 1, "machine": platform.platform(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_avg_1_5_15_per_round": [[round(x, 1) for x in v] for v in load],
            "batch": "8 prompts x 8 samples, 48-256 sampled tokens + 24-token prompt, micro-batch 4, fp32",
            "model": "Qwen2, hidden 256, 2 layers, 4 heads, 2 kv heads, vocab 512 (examples/tiny_tir.py)"}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "learner_step_opob.json").write_text(
        json.dumps({"config": meta, "cases": res, "ratios": ratios}, indent=2)
    )
    md = [
        "# Torch learner step: exact OPOB's norms (ghost vs a backward per trajectory) vs proxy OPOB",
        "",
        f"{meta['date']}, median of {repeats}, 1 torch thread, {meta['machine']}; {meta['model']}; {meta['batch']}.",
        f"Load average (1 min) per round: {', '.join(f'{v[0]:.1f}' for v in load)} on 2 cores shared with other "
        "work: CPU seconds of this process are the figure to read, not an idle-machine one.",
        "",
        "| case | CPU s | wall s |",
        "|---|---|---|",
        *(f"| {n} | {r['median_cpu_s']:.2f} | {r['median_wall_s']:.2f} |" for n, r in res.items()),
        "",
        *(f"- {k}: **{v:.2f}**" for k, v in ratios.items()),
        "",
    ]
    (OUT / "learner_step_opob.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
