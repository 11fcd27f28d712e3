"""Where exact OPOB's step goes with ghost norms on CPU, at the main job's shapes: the parts of the ghost step
against a backward per trajectory, timed in the same process and the same rounds.

    .venv/bin/python benchmarks/ghost_breakdown.py [--repeats 3]
        # -> benchmarks/results/ghost_breakdown.{json,md}

The torch learner's rank (`TorchRank`, fp32, 1 thread) on the model of examples/tiny_tir.py (Qwen2, hidden 256,
2 layers, vocab 512) and learner_step.py's batch (8 prompts x 8 samples, 48-256 sampled tokens + a 24-token prompt,
sorted by length, micro-batch 4). Cells: exact OPOB with ghost norms, the group's graphs held (the fastest ghost
layout in benchmarks/results/learner_step_opob.md), and with a backward per trajectory. Inside the ghost step,
process CPU seconds of: `GhostNorms.norms` in all (the activation-only backward with its hooks, and the head's
share), the hooks of each layer kind, and the output head's share; the rest of the step is the forwards, the
weighted backward and the optimizer. CPU seconds of this process are the figure on a shared machine (the load
average is recorded per round).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_paths import ROOT  # noqa: E402
from learner_step import make_groups  # noqa: E402

import vcpo.ghost as ghost_mod  # noqa: E402
from agent_rl.batch import collate  # noqa: E402
from agent_rl.learners._torch_rank import RankSpec, TorchRank  # noqa: E402
from agent_rl.tools.tiny import build_tiny, sample_corpus  # noqa: E402
from vcpo import StepConfig  # noqa: E402

OUT = ROOT / "benchmarks" / "results"


class Clock:
    """CPU seconds spent inside the ghost norms' entry points, by part (patched onto GhostNorms while it runs)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        cls = ghost_mod.GhostNorms
        self._orig = (cls._grad_hook, cls._add_head, cls.norms)
        clock = self

        def grad_hook(norms, layer):
            inner = clock._orig[0](norms, layer)

            def hook(g):
                c = time.process_time()
                inner(g)
                clock.add(f"hooks: {layer.kind}", time.process_time() - c)

            return hook

        def add_head(norms):
            c = time.process_time()
            clock._orig[1](norms)
            clock.add("output head's share", time.process_time() - c)

        def all_norms(norms, f, **kw):
            c = time.process_time()
            out = clock._orig[2](norms, f, **kw)
            clock.add("GhostNorms.norms (activation-only backward, hooks, head)", time.process_time() - c)
            return out

        cls._grad_hook, cls._add_head, cls.norms = grad_hook, add_head, all_norms

    def add(self, part: str, s: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + s

    def close(self) -> None:
        cls = ghost_mod.GhostNorms
        cls._grad_hook, cls._add_head, cls.norms = self._orig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cells = {
        "ghost norms, group's graphs held": dict(opob_norms="ghost", proxy_hold_group=True),
        "backward per trajectory": dict(opob_norms="backward"),
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
                    gradient_checkpointing=False, seed=0,
                    step=StepConfig(opob_mode="exact", micro_batch_size=4, **cfg),
                )
            )
            for name, cfg in cells.items()
        }  # fmt: skip
        first = next(iter(ranks.values()))
        batch = collate(make_groups(first.model.config.vocab_size, 8, 8, 48, 256), sort_by_length=True).policy
        init = {k: v.clone() for k, v in first.model.state_dict().items()}
        step_s: dict[str, list[float]] = {n: [] for n in cells}
        parts: list[dict[str, float]] = []
        clock = Clock()
        try:
            for rnd in range(args.repeats + 1):  # round 0 warms up
                for name, rk in ranks.items():
                    rk.model.load_state_dict(init)
                    clock.parts = {}
                    c = time.process_time()
                    rk.step(batch)
                    if rnd:
                        step_s[name].append(time.process_time() - c)
                        if clock.parts:
                            parts.append(dict(clock.parts))
                load.append(os.getloadavg())
                print(f"[{time.strftime('%H:%M:%S')}] round {rnd}, load {load[-1][0]:.1f}", flush=True)
        finally:
            clock.close()
    med = {n: statistics.median(v) for n, v in step_s.items()}
    part_med = {k: statistics.median(p.get(k, 0.0) for p in parts) for k in parts[0]}
    ghost, backward = med["ghost norms, group's graphs held"], med["backward per trajectory"]
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats, "torch_threads": 1,
        "machine": platform.platform(), "torch": torch.__version__,
        "load_avg_1_5_15_per_round": [[round(x, 1) for x in v] for v in load],
        "model": "Qwen2, hidden 256, 2 layers, 4 heads, 2 kv heads, vocab 512 (examples/tiny_tir.py)",
        "batch": "8 prompts x 8 samples, 48-256 sampled tokens + 24-token prompt, sorted, micro-batch 4, fp32",
    }  # fmt: skip
    res = {"config": meta, "step_cpu_s": step_s, "median_step_cpu_s": med, "ghost_parts_median_cpu_s": part_med,
           "ghost / backward": ghost / backward}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ghost_breakdown.json").write_text(json.dumps(res, indent=2))
    md = [
        "# Exact OPOB with ghost norms on CPU: where the step goes (torch learner)",
        "",
        f"{meta['date']}, median of {args.repeats}, 1 torch thread, {meta['machine']}, torch {meta['torch']}; "
        f"{meta['model']}; {meta['batch']}.",
        f"Load average (1 min) per round: {', '.join(f'{v[0]:.1f}' for v in load)} on 2 shared cores: CPU seconds "
        "of this process are the figure, not an idle machine's.",
        "",
        "| cell or part | CPU s |",
        "|---|---|",
        *(f"| step: {n} | {s:.2f} |" for n, s in med.items()),
        *(f"| ghost step, inside: {k} | {s:.2f} |" for k, s in part_med.items()),
        "",
        f"- ghost / backward (cpu): **{ghost / backward:.2f}**",
        "",
    ]
    (args.out / "ghost_breakdown.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
