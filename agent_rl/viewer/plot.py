"""Draw a run's standard curves from metrics.jsonl to PNG (`agent-rl plot RUN_DIR`)."""

from __future__ import annotations

from pathlib import Path

from agent_rl.metrics import read_metrics

# Panel title -> metric keys drawn in it (the names the trainer logs; see agent_rl/trainer.py).
STANDARD_CURVES: dict[str, tuple[str, ...]] = {
    "reward": ("rollout/reward_mean", "eval/accuracy"),
    "ESS ratio": ("vcpo/ess_ratio", "vcpo/lr_scale"),
    "grad norm": ("learner/grad_norm",),
    "staleness": ("buffer/staleness_mean", "buffer/staleness_max"),
    "throughput (tokens/s)": ("perf/rollout_tokens_per_s", "perf/learner_tokens_per_s"),
}


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write `curves.png` (one panel per standard curve) into the run dir; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    if not records:
        raise ValueError(f"{Path(run_dir) / 'metrics.jsonl'} has no records yet: nothing to plot")
    out_path = Path(out) if out else Path(run_dir) / "curves.png"
    fig, axes = plt.subplots(1, len(STANDARD_CURVES), figsize=(4.2 * len(STANDARD_CURVES), 3.4))
    for ax, (title, keys) in zip(axes, STANDARD_CURVES.items(), strict=True):
        drawn = False
        for key in keys:
            pts = [(r["step"], r[key]) for r in records if key in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="." if len(pts) < 50 else None, label=key)
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
