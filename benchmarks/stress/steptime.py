"""Step-time overhead of each method against plain, measured in one process, interleaved.

The grid's own step times come from runs hours apart on a shared machine, so their ratios
mostly measure the load. Here every method steps the same stale batch in turn, round after
round, and the ratio is of medians taken in the same minutes:

    .venv/bin/python -m benchmarks.stress.steptime     # writes benchmarks/results/stress/steptime.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics as st
import time
from pathlib import Path

import torch

import vcpo
from benchmarks.stress.policy import GRUPolicy
from benchmarks.stress.run import METHODS, RunConfig
from benchmarks.stress.sampler import LagSampler
from benchmarks.stress.task import CountTask

MODES = [(m, "proxy") for m in METHODS] + [("vcpo", "exact"), ("opob", "exact")]


def stale_batch(lag: int, seed: int = 0) -> tuple[GRUPolicy, vcpo.PolicyBatch]:
    """A policy after `lag` plain updates and a batch sampled by its version 0: IS weights != 1."""
    torch.manual_seed(seed)
    task = CountTask()
    policy = GRUPolicy(task.vocab)
    sampler = LagSampler(policy, task, lag=lag, batch_prompts=16, group_size=8, generator=torch.Generator())
    step = vcpo.Step(
        policy,
        torch.optim.Adam(policy.parameters(), lr=5e-3),
        RunConfig("plain", lag, 5e-3, seed).step_config(),
    )
    sampler.publish(0, policy)
    for v in range(lag):
        step(sampler.sample().batch)
        sampler.publish(v + 1, policy)
    return policy, sampler.sample().batch


def measure(rounds: int, lag: int) -> dict[str, dict[str, float]]:
    policy, batch = stale_batch(lag)
    steps = {}
    for method, mode in MODES:
        model = copy.deepcopy(policy)
        cfg = RunConfig(method, lag, 5e-3, 0, opob_mode=mode).step_config()
        # lr 0: the weights (and so the work per step) stay the same round after round.
        steps[f"{method}[{mode}]"] = vcpo.Step(model, torch.optim.Adam(model.parameters(), lr=0.0), cfg)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step(batch)
            times[name].append(time.perf_counter() - t0)
    base = st.median(times["plain[proxy]"])
    return {k: {"median_s": st.median(v), "vs_plain": st.median(v) / base} for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--lag", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/stress/steptime.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = measure(args.rounds, args.lag)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"rounds": args.rounds, "lag": args.lag, "batch": 128, "methods": res}, indent=1)
    )
    for k, v in res.items():
        print(f"{k:16s} {v['median_s'] * 1e3:8.1f} ms  {v['vs_plain']:.2f}x plain")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
