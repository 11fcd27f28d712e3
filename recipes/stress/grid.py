"""The staleness grid: every (method, lag, lr, seed) cell of the study config, then the report.

    .venv/bin/python -m recipes.stress.grid                 # recipes/stress/grid.yaml (the reduced grid)
    .venv/bin/python -m recipes.stress.grid --full          # recipes/stress/grid_full.yaml
    .venv/bin/python -m recipes.stress.grid --report-only   # tables + PNG from the runs already done

Each finished run is appended to <out>/runs.jsonl at once, so an interrupted grid resumes
where it stopped (cells already in the file are skipped) and a partial grid still reports.
Git keeps runs.jsonl.gz: --report-only reads it when runs.jsonl is absent; to resume or extend
a committed grid, `gunzip -k` it first. Workers are niced, single-threaded processes: the machine is shared.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.yamlio import ConfigError, load_model
from recipes.stress.run import METHODS, RunConfig, run

HERE = Path(__file__).resolve().parent
LAGS_ALLOWED = range(0, 1025)


class Block(BaseModel):
    """A rectangle of cells: every method x lag x lr listed here."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    methods: tuple[str, ...]
    lags: tuple[int, ...]
    lrs: tuple[float, ...]
    opob_mode: str | None = Field(None, pattern="^(exact|proxy)$")
    """Overrides the study's OPOB mode for this block (e.g. an exact-gradient check of VCPO)."""
    seeds: int | None = Field(None, ge=1)
    """Overrides the study's seed count for this block."""

    @field_validator("methods")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; expected some of {sorted(METHODS)}")
        return v

    @field_validator("lags")
    @classmethod
    def _lags(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(k < 0 for k in v):
            raise ValueError(f"lags must be >= 0, got {list(v)}")
        return v

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not lr > 0 for lr in v):
            raise ValueError(f"learning rates must be > 0, got {list(v)}")
        return v


class StudyConfig(BaseModel):
    """The grid file (not an agent-rl training recipe)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    reference_lr: float = Field(..., gt=0)
    """The lr whose tables are the headline (sync's fastest stable rate); k* is measured there."""
    seeds: int = Field(5, ge=1)
    steps: int = Field(250, ge=1)
    batch_prompts: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2)
    eval_every: int = Field(10, ge=1)
    opob_mode: str = Field("proxy", pattern="^(exact|proxy)$")
    workers: int = Field(2, ge=1)
    out: str = "benchmarks/results/stress"
    blocks: tuple[Block, ...]

    def cells(self) -> list[RunConfig]:
        """Every run, in the order they are started: block by block, and within a block seed by
        seed, so a grid cut short has whole seed waves of the first blocks."""
        seen: dict[tuple, RunConfig] = {}
        for b in self.blocks:
            for seed in range(b.seeds or self.seeds):
                for lr in b.lrs:
                    for method in b.methods:
                        for lag in sorted(b.lags, reverse=True):
                            cfg = RunConfig(
                                method=method, lag=lag, lr=lr, seed=seed, steps=self.steps,
                                batch_prompts=self.batch_prompts, group_size=self.group_size,
                                eval_every=self.eval_every, opob_mode=b.opob_mode or self.opob_mode,
                            )  # fmt: skip
                            seen.setdefault(cell_key(cfg), cfg)
        return list(seen.values())


def cell_key(cfg: RunConfig) -> tuple:
    return (
        cfg.method,
        cfg.lag,
        cfg.lr,
        cfg.seed,
        cfg.steps,
        cfg.batch_prompts,
        cfg.group_size,
        cfg.opob_mode,
    )


def _worker_init() -> None:
    os.nice(5)
    import torch

    torch.set_num_threads(1)


def _one(cfg: RunConfig) -> dict:
    t0 = time.perf_counter()
    res = run(cfg).as_dict()
    res["wall_seconds"] = time.perf_counter() - t0
    return res


def load_runs(path: Path) -> list[dict]:
    """The runs in `path`, or in `path`.gz (the compressed copy kept in git) when only that exists."""
    packed = path.with_name(path.name + ".gz")
    if path.exists():
        text = path.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_grid(study: StudyConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = {cell_key(RunConfig(**r["config"])) for r in load_runs(runs_path)}
    todo = [c for c in study.cells() if cell_key(c) not in done]
    print(
        f"{len(done)} runs already in {runs_path}; {len(todo)} to go on {study.workers} workers", flush=True
    )
    t0 = time.time()
    with Pool(study.workers, initializer=_worker_init) as pool, runs_path.open("a") as f:
        for i, res in enumerate(pool.imap_unordered(_one, todo), 1):
            f.write(json.dumps(res) + "\n")
            f.flush()
            c = res["config"]
            print(
                f"[{i}/{len(todo)} {time.time() - t0:.0f}s] {c['method']} k={c['lag']} lr={c['lr']} "
                f"seed={c['seed']}: held-out {res['heldout_reward'][-1]:.3f} ({res['wall_seconds']:.1f}s)"
                + (f" ERROR {res['error']}" if res["error"] else ""),
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--config", type=Path, default=None, help="study YAML (default: recipes/stress/grid.yaml)"
    )
    ap.add_argument("--full", action="store_true", help="use recipes/stress/grid_full.yaml")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the tables and PNG")
    ap.add_argument("--out", type=Path, default=None, help="results directory (default: the config's out)")
    args = ap.parse_args(argv)
    path = args.config or HERE / ("grid_full.yaml" if args.full else "grid.yaml")
    try:
        study = load_model(path, StudyConfig)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    out = args.out or Path(study.out)
    if not args.report_only:
        run_grid(study, out)
    from recipes.stress.report import write_report

    for p in write_report(study, load_runs(out / "runs.jsonl"), out):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
