"""Torch learner step time with rows in arrival order versus sorted by length (less padding per micro-batch).

    .venv/bin/python benchmarks/learner_padding.py [--repeats 5]

Multi-turn trajectories differ several-fold in length, and a micro-batch is padded to its
longest row. The learner sorts each rank's rows longest first (`collate(sort_by_length=True)`);
this measures what that buys on the chunked losses (GRPO-style REINFORCE, micro-batch 4)
with the tiny Qwen2 of the test suite, 8 prompts x 4 samples, lengths drawn uniformly from
48-768 tokens. Both orders run interleaved in one process on the same weights (restored
before every step), on one torch thread; the ratios are sorted / arrival of the median
CPU time (this process's, robust to other load on a shared machine) and of wall time. Writes benchmarks/results/learner_padding.{json,md}.
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
from agent_rl.tiny import build_tiny, sample_corpus
from agent_rl.types import Group, Trajectory
from vcpo.step import StepConfig

OUT = Path(__file__).resolve().parent / "results"
GROUPS, PER_GROUP, MBS, MIN_LEN, MAX_LEN = 8, 4, 4, 48, 768


def make_groups(vocab: int) -> list[Group]:
    g = torch.Generator().manual_seed(0)
    groups = []
    for gi in range(GROUPS):
        prompt = torch.randint(3, vocab, (24,), generator=g).tolist()
        trajs = []
        for i in range(PER_GROUP):
            n = int(torch.randint(MIN_LEN, MAX_LEN + 1, (1,), generator=g))
            t = Trajectory(uid=f"{gi}-{i}", group_id=f"g{gi}", prompt_ids=prompt, reward=float(i % 2))
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            t.append_sampled(ids, (-torch.rand(n, generator=g) * 6).tolist(), 0)
            trajs.append(t)
        groups.append(Group(f"g{gi}", trajs))
    return groups


def padded_tokens(batch, mbs: int) -> tuple[int, int]:
    """(tokens the forward passes compute, real tokens) for row chunks of `mbs`."""
    lengths = batch.attention_mask.sum(-1).tolist()
    computed = sum(len(c) * max(c) for c in (lengths[i : i + mbs] for i in range(0, len(lengths), mbs)))
    return computed, sum(lengths)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny(d, sample_corpus(), vocab_size=512, seed=0, max_positions=1024)
        step = StepConfig(loss="reinforce", advantage="grpo", ess_lr_rule="none", micro_batch_size=MBS)
        spec = RankSpec(
            model_path=str(model_dir), weights_dtype="float32", compute_dtype="float32", lr=1e-5, betas=(0.9, 0.999),
            weight_decay=0.0, lr_schedule="constant", warmup_steps=0, total_steps=1000,
            gradient_checkpointing=False, step=step, seed=0,
        )  # fmt: skip
        rank = TorchRank(spec)
        vocab = rank.model.config.vocab_size
        groups = make_groups(vocab)
        batches = {"arrival": collate(groups).policy, "sorted": collate(groups, sort_by_length=True).policy}
        init = {k: v.clone() for k, v in rank.model.state_dict().items()}
        opt_init = rank.optimizer.state_dict()
        times: dict[str, list[float]] = {k: [] for k in batches}
        cpu: dict[str, list[float]] = {k: [] for k in batches}
        for r in range(args.repeats + 1):  # the first round warms up
            for name, batch in batches.items():
                rank.model.load_state_dict(init)
                rank.optimizer.load_state_dict(opt_init)
                t0, c0 = time.perf_counter(), time.process_time()
                rank.step(batch)
                if r:
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
                print(
                    f"[{time.strftime('%H:%M:%S')}] round {r} {name}: {time.perf_counter() - t0:.2f}s",
                    flush=True,
                )
    result = {"config": {"groups": GROUPS, "per_group": PER_GROUP, "micro_batch": MBS, "lengths": [MIN_LEN, MAX_LEN],
                         "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
                         "machine": platform.platform()}}  # fmt: skip
    for name, batch in batches.items():
        computed, real = padded_tokens(batch, MBS)
        result[name] = {
            "median_step_s": statistics.median(times[name]),
            "median_step_cpu_s": statistics.median(cpu[name]),
            "computed_tokens": computed,
            "real_tokens": real,
            "padding_fraction": 1 - real / computed,
        }
    ratio = result["sorted"]["median_step_s"] / result["arrival"]["median_step_s"]
    cpu_ratio = result["sorted"]["median_step_cpu_s"] / result["arrival"]["median_step_cpu_s"]
    result["sorted_over_arrival_wall"] = ratio
    result["sorted_over_arrival_cpu"] = cpu_ratio
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "learner_padding.json").write_text(json.dumps(result, indent=2))
    md = [
        "# Learner step: rows in arrival order vs sorted by length",
        "",
        f"{GROUPS} prompts x {PER_GROUP} samples, lengths {MIN_LEN}-{MAX_LEN}, micro-batch {MBS}, "
        f"median of {args.repeats}; {result['config']['machine']}",
        "",
        "| order | step CPU (s) | step wall (s) | padding fraction |",
        "|---|---|---|---|",
    ]
    for name in batches:
        r = result[name]
        md.append(
            f"| {name} | {r['median_step_cpu_s']:.2f} | {r['median_step_s']:.2f} | {r['padding_fraction']:.2f} |"
        )
    md += ["", f"sorted / arrival: CPU time **{cpu_ratio:.2f}**, wall time {ratio:.2f}", ""]
    (OUT / "learner_padding.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
