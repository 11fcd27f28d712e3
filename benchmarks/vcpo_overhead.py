"""Wall time of one VCPO step (exact and proxy OPOB) versus one plain GRPO step on the same batch.

    .venv/bin/python benchmarks/vcpo_overhead.py [--repeats 5]

Model: a random Qwen2ForCausalLM (hidden 64, 2 layers, vocab 512), briefly fitted to a
synthetic corpus so its predictions are not uniform. Batch: 64 trajectories (8 prompts x 8
samples) of a few hundred tokens sampled from a perturbed copy (the stale behaviour policy).
All three steps run interleaved in the same process; ratios are against the GRPO step.
It also measures how close the forward-only OPOB proxy baseline is to the exact one.
Writes benchmarks/results/vcpo_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from vcpo import PolicyBatch, Step, StepConfig, logit_grad_proxy_of, logprobs_of, opob_baseline
from vcpo.advantages import group_stats

OUT = Path(__file__).resolve().parent / "results"
GROUPS, PER_GROUP, PROMPT, MIN_RESP, MAX_RESP = 8, 8, 32, 160, 288

CONFIGS = {
    "grpo": StepConfig(loss="reinforce", advantage="grpo", ess_lr_rule="none", micro_batch_size=8),
    "vcpo_proxy": StepConfig(loss="vcpo", advantage="opob", opob_mode="proxy", micro_batch_size=8),
    "vcpo_exact": StepConfig(loss="vcpo", advantage="opob", opob_mode="exact", micro_batch_size=8),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False, use_cache=False, max_position_embeddings=1024,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    # Fit a little to a synthetic corpus (strided counting sequences) so distributions are peaked.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        start = torch.randint(0, 512, (16, 1), generator=g)
        stride = torch.randint(1, 4, (16, 1), generator=g)
        ids = (start + stride * torch.arange(128)) % 512
        noise = torch.rand(ids.shape, generator=g) < 0.2
        ids = torch.where(noise, torch.randint(0, 512, ids.shape, generator=g), ids)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"fitted tiny Qwen2 ({n_params:.2f}M params), loss {float(loss.detach()):.2f}")
    return model


def sample_batch(model: torch.nn.Module, staleness: float) -> PolicyBatch:
    """64 trajectories sampled from a perturbed copy of the model (the stale sampler)."""
    behaviour = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in behaviour.parameters():
            p.add_(staleness * p.std() * torch.randn(p.shape, generator=g))
    prompts = torch.randint(0, 512, (GROUPS, PROMPT), generator=g).repeat_interleave(PER_GROUP, 0)
    torch.manual_seed(2)
    with torch.no_grad():
        seqs = behaviour.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=MAX_RESP, do_sample=True,
            top_k=0, top_p=1.0, temperature=1.0, use_cache=True, pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    b, t = seqs.shape
    lengths = PROMPT + torch.randint(MIN_RESP, MAX_RESP + 1, (b,), generator=g)
    pos = torch.arange(t)[None, :]
    am = (pos < lengths[:, None]).long()
    ids = torch.where(am > 0, seqs, 0)
    lm = ((pos >= PROMPT) & (am > 0)).float()
    with torch.no_grad():
        blp = torch.where(lm > 0, logprobs_of(behaviour, ids, am), 0.0)
    rewards = (torch.rand(b, generator=g) < 0.5).float()
    rewards[::PER_GROUP], rewards[1::PER_GROUP] = 1.0, 0.0  # every group has both outcomes: no free skips
    return PolicyBatch(ids, am, lm, blp, rewards, torch.arange(GROUPS).repeat_interleave(PER_GROUP))


def time_steps(base: torch.nn.Module, batch: PolicyBatch, repeats: int) -> tuple[dict, dict]:
    """Wall and process-CPU seconds per step, the three kinds interleaved round by round.

    CPU time is reported beside wall time because on a shared machine wall time mostly
    measures the neighbours; the min over rounds is the least disturbed wall sample.
    """
    wall: dict[str, list[float]] = {k: [] for k in CONFIGS}
    cpu: dict[str, list[float]] = {k: [] for k in CONFIGS}
    for rep in range(repeats + 1):  # round 0 is warm-up
        for name, cfg in CONFIGS.items():
            model = copy.deepcopy(base)
            step = Step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), cfg)
            t0, c0 = time.perf_counter(), time.process_time()
            metrics = step(batch)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if rep > 0:
                wall[name].append(dt)
                cpu[name].append(dc)
            log(f"round {rep} {name:10s} wall {dt:6.2f} s  cpu {dc:6.2f} s  ess_ratio {metrics.ess_ratio:.3f}  "
                f"lr_scale {metrics.lr_scale:.3f}")  # fmt: skip
            del model, step
    return wall, cpu


def exact_grad_sq(model: torch.nn.Module, batch: PolicyBatch) -> torch.Tensor:
    """‖∇θ mean_t log π(τ_i)‖² by one backward per trajectory (what exact mode computes)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(batch.size):
        sub = batch.select(torch.tensor([i]))
        lp = logprobs_of(model, sub.input_ids, sub.attention_mask)
        mean_lp = (lp * sub.loss_mask).sum() / sub.loss_mask.sum()
        grads = torch.autograd.grad(mean_lp, params)
        out.append(sum(float(x.double().pow(2).sum()) for x in grads))
    return torch.tensor(out, dtype=torch.float64)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def proxy_vs_exact(model: torch.nn.Module, batch: PolicyBatch, truncation: float = 8.0) -> dict[str, float]:
    exact = exact_grad_sq(model, batch)
    with torch.no_grad():
        lp, gsq_tok = logit_grad_proxy_of(model, batch.input_ids, batch.attention_mask)
    tokens = batch.loss_mask.double().sum(-1)
    proxy = (gsq_tok * batch.loss_mask).double().sum(-1) / tokens**2
    s = ((lp.double() - batch.behavior_logprobs.double()) * batch.loss_mask).sum(-1)
    log_wt = s.clamp(max=float(torch.log(torch.tensor(truncation))))
    r, gid = batch.rewards.double(), batch.group_index
    b_exact = opob_baseline(r, log_wt, exact, gid)
    b_proxy = opob_baseline(r, log_wt, proxy, gid)
    b_unit = opob_baseline(r, log_wt, torch.ones_like(exact), gid)  # IS weights only, no norms
    stats = group_stats(r, gid)
    sigma = stats.std.clamp(min=1e-6)
    per_group = [spearman(exact[gid == k], proxy[gid == k]) for k in gid.unique().tolist()]
    return {
        "spearman_norms_all": spearman(exact, proxy),
        "spearman_norms_within_group_mean": statistics.mean(per_group),
        "baseline_err_proxy_over_sigma": float(((b_proxy - b_exact).abs() / sigma).mean()),
        "baseline_err_group_mean_over_sigma": float(((stats.mean - b_exact).abs() / sigma).mean()),
        "baseline_err_weights_only_over_sigma": float(((b_unit - b_exact).abs() / sigma).mean()),
        "exact_norm_ratio_max_min_within_group_mean": statistics.mean(
            float(exact[gid == k].max() / exact[gid == k].min()) for k in gid.unique().tolist()
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared box)"
    )
    ap.add_argument(
        "--staleness", type=float, default=0.02, help="relative weight noise of the behaviour policy"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    model = build_model()
    batch = sample_batch(model, args.staleness)
    log(f"batch: {batch.size} trajectories, {int(batch.attention_mask.sum())} tokens, "
        f"{int(batch.loss_mask.sum())} loss tokens, width {batch.input_ids.shape[1]}")  # fmt: skip
    times, cpu = time_steps(model, batch, args.repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    log("proxy vs exact OPOB baseline")
    quality = proxy_vs_exact(model, batch)
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()} {platform.processor()}, {torch.get_num_threads()} torch thread(s), "
        f"load average {os.getloadavg()[0]:.1f} at the end (2 cores shared with other jobs)",
        "batch": {
            "trajectories": batch.size,
            "tokens": int(batch.attention_mask.sum()),
            "loss_tokens": int(batch.loss_mask.sum()),
            "groups": GROUPS,
        },  # fmt: skip
        "seconds": times,
        "median_s": med,
        "min_s": best,
        "ratio_median_vs_grpo": {k: med[k] / med["grpo"] for k in med},
        "ratio_min_vs_grpo": {k: best[k] / best["grpo"] for k in best},
        "cpu_seconds": cpu,
        "cpu_median_s": cpu_med,
        "cpu_ratio_median_vs_grpo": {k: cpu_med[k] / cpu_med["grpo"] for k in cpu_med},
        "opob_proxy_vs_exact": quality,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vcpo_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        "| step | wall median s | wall min s | ratio (median) | ratio (min) | cpu median s | cpu ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in CONFIGS:
        rows.append(f"| {k} | {med[k]:.3f} | {best[k]:.3f} | {result['ratio_median_vs_grpo'][k]:.2f}x "
                    f"| {result['ratio_min_vs_grpo'][k]:.2f}x | {cpu_med[k]:.3f} "
                    f"| {result['cpu_ratio_median_vs_grpo'][k]:.2f}x |")  # fmt: skip
    rows += ["", "| OPOB proxy vs exact | value |", "|---|---|"]
    rows += [f"| {k} | {v:.3f} |" for k, v in quality.items()]
    (OUT / "vcpo_overhead.md").write_text(
        f"# vcpo overhead\n\n`{result['command']}` on {result['machine']}\n\n" + "\n".join(rows) + "\n"
    )
    print("\n".join(rows))
    log(f"wrote {OUT / 'vcpo_overhead.json'} and .md")


if __name__ == "__main__":
    main()
