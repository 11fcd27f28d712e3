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
seconds, medians over rounds; a ratio of two cases is the median of the per-round ratios (benchmarks/harness/stats.py;
a round steps every case once). Writes benchmarks/results/learner_step.{json,md} with benchmarks/harness
(provenance under `meta`, each case's rounds kept, one writer); `--from-results FILE` rewrites a results file's
ratios and page from its rounds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import bench_paths  # noqa: F401  (puts the checkout on sys.path)
import torch

from agent_rl.batch import collate
from agent_rl.learners._torch_rank import RankSpec, TorchRank
from agent_rl.tools.tiny import build_tiny, sample_corpus
from agent_rl.types import Group, Trajectory
from benchmarks.harness.provenance import Provenance, describe, load_average
from benchmarks.harness.report import log, quick_args, results_dir, results_file, table, write
from benchmarks.harness.runner import plan
from benchmarks.harness.stats import median_speedup, spread
from vcpo import PolicyBatch, StepConfig

# ratio name -> (case, case it is divided by, "cpu" or "wall")
PAD_RATIOS = {
    "sorted / arrival (cpu)": ("grpo, mbs 4, sorted by length", "grpo, mbs 4, arrival order", "cpu"),
    "sorted / arrival (wall)": ("grpo, mbs 4, sorted by length", "grpo, mbs 4, arrival order", "wall"),
    "mbs 8 / mbs 4 (cpu)": ("vcpo proxy, group 8, mbs 8", "vcpo proxy, group 8, mbs 4", "cpu"),
    "mbs 8 / mbs 4 (wall)": ("vcpo proxy, group 8, mbs 8", "vcpo proxy, group 8, mbs 4", "wall"),
}
GHOST, HELD, MB8 = "exact OPOB, ghost norms", "exact OPOB, ghost norms, group's graphs held", (
    "exact OPOB, ghost norms, micro-batch 8 (a group per forward)")  # fmt: skip
BACKWARD, PROXY = "exact OPOB, backward per trajectory", "proxy OPOB (main job)"
OPOB_RATIOS = {"ghost / backward (cpu)": (GHOST, BACKWARD, "cpu"), "ghost / proxy (cpu)": (GHOST, PROXY, "cpu"),
               "ghost held / backward (cpu)": (HELD, BACKWARD, "cpu"),
               "ghost mbs 8 / backward (cpu)": (MB8, BACKWARD, "cpu"),
               "backward / proxy (cpu)": (BACKWARD, PROXY, "cpu")}  # fmt: skip


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--cases", choices=["all", "opob"], default="all", help="opob: the exact-OPOB norms cell only"
    )
    ap.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results)")
    ap.add_argument("--from-results", type=results_file, default=None,
                    help="run nothing: rewrite learner_step_opob.json's ratios and page (into --out) from its rounds")  # fmt: skip
    quick_args(ap, repeats=1)
    args = ap.parse_args(argv)
    args.out = results_dir(args.out, scratch=args.quick, name="learner_step")
    if args.from_results is not None:
        d = json.loads(args.from_results.read_text())
        ratios = OPOB_RATIOS if "batch" in d["config"] else PAD_RATIOS
        write(args.from_results.stem, d | summarise(d["cases"], ratios), args.out, markdown)
        return
    prov = Provenance()
    torch.set_num_threads(1)
    if args.cases == "opob":
        opob_norms(args.repeats, args.out, prov)
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
        t = time_rounds({n: (rk, b, _same_code) for n, (rk, b, _) in cases.items()}, args.repeats)
    res = {n: t[n] | {"padding_fraction": padding_fraction(b, mbs)} for n, (_, b, mbs) in cases.items()}
    d = {"meta": prov.meta(), "config": {"repeats": args.repeats, "torch_threads": 1}, "cases": res}
    write("learner_step", d | summarise(res, PAD_RATIOS), args.out, markdown)


def time_rounds(
    cases: dict[str, tuple[TorchRank, PolicyBatch, Callable[[], None]]], repeats: int
) -> dict[str, dict[str, list[float]]]:
    """Per case, the CPU and wall seconds of its step each round and the load average after it: the cases in the
    harness's order (`runner.plan`, rounds as seeds: rotated by one each round), round 0 a warm-up; every case steps
    from the same weights and optimizer state (restored before each step), after its `setup()` (the code it runs).
    Also benchmarks/learner_step_agent_arith.py's."""
    ranks = {id(rk): rk for rk, _, _ in cases.values()}
    init = {k: v.clone() for k, v in next(iter(ranks.values())).model.state_dict().items()}
    opt_init = {key: rk.optimizer.state_dict() for key, rk in ranks.items()}
    out: dict[str, dict[str, list[float]]] = {n: {"cpu_s": [], "wall_s": [], "load": []} for n in cases}
    for i, job in enumerate(plan(list(cases), range(repeats + 1))):
        rk, batch, setup = cases[job.cell]
        rk.model.load_state_dict(init)
        rk.optimizer.load_state_dict(opt_init[id(rk)])
        setup()
        t0, c0 = time.perf_counter(), time.process_time()
        rk.step(batch)
        if job.seed:
            out[job.cell]["wall_s"].append(time.perf_counter() - t0)
            out[job.cell]["cpu_s"].append(time.process_time() - c0)
            out[job.cell]["load"].append(load_average()[0])
        if i % len(cases) == len(cases) - 1:
            log(f"round {job.seed} done, load {load_average()[0]}")
    return out


def _same_code() -> None:
    """A case's `setup` when every case runs the same code."""


def summarise(cases: dict[str, dict], ratios: dict[str, tuple[str, str, str]]) -> dict:
    """Each case's median CPU and wall seconds; each ratio the median of the per-round ratios."""
    med = {n: {"median_cpu_s": spread(c["cpu_s"])["median"], "median_wall_s": spread(c["wall_s"])["median"]}
           for n, c in cases.items()}  # fmt: skip
    rounds = {n: {k: dict(enumerate(c[f"{k}_s"])) for k in ("cpu", "wall")} for n, c in cases.items()}
    return {"median": med,
            "ratios": {name: median_speedup(rounds[a][k], rounds[b][k])[0] for name, (a, b, k) in ratios.items()}}  # fmt: skip


def markdown(d: dict) -> str:
    """Either cell's page from its JSON alone."""
    opob, c, m = "batch" in d["config"], d["config"], d["median"]
    meta = d.get("meta")  # None: written before the harness, its date, machine and loads under config
    when = (f"{describe(meta) if meta else c.get('date', '') + ', ' + c['machine']}, median of {c['repeats']}, "
            "1 torch thread" + (f"; {c['model']}; {c['batch']}" if opob else ""))  # fmt: skip
    load = (f"before / after: {meta['load_before'][0]:.1f} / {meta['load_after'][0]:.1f}" if meta
            else f"per round: {', '.join(f'{v[0]:.1f}' for v in c.get('load_avg_1_5_15_per_round', []))}")  # fmt: skip
    rows = [[n, f"{r['median_cpu_s']:.2f}", f"{r['median_wall_s']:.2f}"]
            + ([] if opob else [f"{d['cases'][n]['padding_fraction']:.2f}"]) for n, r in m.items()]  # fmt: skip
    title = ("exact OPOB's norms (ghost vs a backward per trajectory) vs proxy OPOB" if opob
             else "padding and micro-batch size")  # fmt: skip
    return "\n".join([
        f"# Torch learner step: {title}", "", when + ".",
        *([f"Load average (1 min) {load} on 2 cores shared with other work: CPU seconds of this process are the "
           "figure to read, not an idle-machine one."] if opob else []),
        "", *table(["case", "CPU s", "wall s"] + ([] if opob else ["padding fraction"]), rows), "",
        *(f"- {k}: **{v:.2f}** (median of the per-round ratios)" for k, v in d["ratios"].items()), "",
    ])  # fmt: skip


def opob_norms(repeats: int, out: Path, prov: Provenance) -> None:
    """Cell 3: exact OPOB with ghost norms vs a backward per trajectory vs proxy OPOB, main job's shapes."""
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
        res = time_rounds({n: (rk, batch, _same_code) for n, rk in ranks.items()}, repeats)
    config = {"repeats": repeats, "torch_threads": 1, "torch": torch.__version__,
              "batch": "8 prompts x 8 samples, 48-256 sampled tokens + 24-token prompt, micro-batch 4, fp32",
              "model": "Qwen2, hidden 256, 2 layers, 4 heads, 2 kv heads, vocab 512 (examples/tiny_tir.py)"}  # fmt: skip
    write(
        "learner_step_opob",
        {"meta": prov.meta(), "config": config, "cases": res} | summarise(res, OPOB_RATIOS),
        out,
        markdown,
    )


if __name__ == "__main__":
    main()
