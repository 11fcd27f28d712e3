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
import statistics
import time

import bench_paths  # noqa: F401  (puts the checkout on sys.path)
import torch

from benchmarks.harness.provenance import Provenance, describe
from benchmarks.harness.report import log, quick_args, results_args, results_dir, rewrite, table, write
from benchmarks.harness.runner import plan
from benchmarks.harness.stats import median_speedup, spread
from vcpo import PolicyBatch, Step, StepConfig, logit_grad_proxy_of, logprobs_of, opob_baseline
from vcpo.advantages import group_stats

GROUPS, PER_GROUP, PROMPT, MIN_RESP, MAX_RESP = 8, 8, 32, 160, 288

CONFIGS = {
    "grpo": StepConfig(loss="reinforce", advantage="grpo", ess_lr_rule="none", micro_batch_size=8),
    "vcpo_proxy": StepConfig(loss="vcpo", advantage="opob", opob_mode="proxy", micro_batch_size=8),
    "vcpo_exact": StepConfig(loss="vcpo", advantage="opob", opob_mode="exact", micro_batch_size=8),
}


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
    """Wall and process-CPU seconds per step, the three kinds interleaved round by round in the harness's order
    (`runner.plan`, rounds as seeds: rotated by one each round).

    CPU time is reported beside wall time because on a shared machine wall time mostly
    measures the neighbours; the min over rounds is the least disturbed wall sample.
    """
    wall: dict[str, list[float]] = {k: [] for k in CONFIGS}
    cpu: dict[str, list[float]] = {k: [] for k in CONFIGS}
    for job in plan(list(CONFIGS), range(repeats + 1)):  # round 0 is warm-up
        rep, name = job.seed, job.cell
        model = copy.deepcopy(base)
        step = Step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), CONFIGS[name])
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


def summarise(times: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict:
    """Medians and minima over rounds; each step's ratio to GRPO as the median of the per-round ratios (the rounds
    are interleaved, so a round's three steps share the machine's state), and as the ratio of the minima (the least
    disturbed samples)."""

    def per_round(xs: dict[str, list[float]]) -> dict[str, float | None]:
        return {k: median_speedup(dict(enumerate(v)), dict(enumerate(xs["grpo"])))[0] for k, v in xs.items()}

    med = {k: spread(v)["median"] for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return {"median_s": med, "min_s": best, "ratio_median_vs_grpo": per_round(times),
            "ratio_min_vs_grpo": {k: best[k] / best["grpo"] for k in best},
            "cpu_median_s": {k: spread(v)["median"] for k, v in cpu.items()},
            "cpu_ratio_median_vs_grpo": per_round(cpu)}  # fmt: skip


def markdown(r: dict) -> str:
    """The results page from the JSON alone."""
    when = f"`{r['command']}` on {r['machine']}" if "meta" not in r else (
        f"`{r['meta']['command']}`, {describe(r['meta'])}, {r['threads']} torch thread(s)")  # fmt: skip
    rows = [[k, f"{r['median_s'][k]:.3f}", f"{r['min_s'][k]:.3f}", f"{r['ratio_median_vs_grpo'][k]:.2f}x",
             f"{r['ratio_min_vs_grpo'][k]:.2f}x", f"{r['cpu_median_s'][k]:.3f}",
             f"{r['cpu_ratio_median_vs_grpo'][k]:.2f}x"] for k in CONFIGS]  # fmt: skip
    head = ["step", "wall median s", "wall min s", "ratio (median of per-round)", "ratio (min)", "cpu median s",
            "cpu ratio (median of per-round)"]  # fmt: skip
    quality = [[k, f"{v:.3f}"] for k, v in r["opob_proxy_vs_exact"].items()]
    lines = [
        "# vcpo overhead",
        "",
        when,
        "",
        *table(head, rows),
        "",
        *table(["OPOB proxy vs exact", "value"], quality),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared box)"
    )
    ap.add_argument(
        "--staleness", type=float, default=0.02, help="relative weight noise of the behaviour policy"
    )
    results_args(ap, "vcpo_overhead")
    quick_args(ap, repeats=1)
    args = ap.parse_args(argv)
    if rewrite(args, "vcpo_overhead", markdown, lambda r: summarise(r["seconds"], r["cpu_seconds"])):
        return
    prov = Provenance()
    torch.set_num_threads(args.threads)
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    model = build_model()
    batch = sample_batch(model, args.staleness)
    log(f"batch: {batch.size} trajectories, {int(batch.attention_mask.sum())} tokens, "
        f"{int(batch.loss_mask.sum())} loss tokens, width {batch.input_ids.shape[1]}")  # fmt: skip
    times, cpu = time_steps(model, batch, args.repeats)
    log("proxy vs exact OPOB baseline")
    quality = proxy_vs_exact(model, batch)
    result = {
        "meta": prov.meta(),
        "threads": torch.get_num_threads(),
        "batch": {
            "trajectories": batch.size,
            "tokens": int(batch.attention_mask.sum()),
            "loss_tokens": int(batch.loss_mask.sum()),
            "groups": GROUPS,
        },  # fmt: skip
        "seconds": times,
        "cpu_seconds": cpu,
        **summarise(times, cpu),
        "opob_proxy_vs_exact": quality,
    }
    write("vcpo_overhead", result, results_dir(args.out, scratch=args.quick, name="vcpo_overhead"), markdown)


if __name__ == "__main__":
    main()
