"""The staleness grid: every (method, lag, lr, seed) cell of the study config, then the report.

    .venv/bin/python -m benchmarks.stress.grid                 # benchmarks/stress/grid.yaml (the reduced grid)
    .venv/bin/python -m benchmarks.stress.grid --full          # benchmarks/stress/grid_full.yaml
    .venv/bin/python -m benchmarks.stress.grid --report-only   # tables + PNG from the runs already done

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

from benchmarks.stress.run import RunConfig, run
from benchmarks.stress.study import StudyConfig, cell_key
from envs.yamlio import ConfigError, load_model

HERE = Path(__file__).resolve().parent


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


def check(paths: list[Path]) -> int:
    """Validate study files (`file:line: field: message` per error, exit 2); `ok (study)` per good file."""
    failed = False
    for path in paths:
        try:
            load_model(path, StudyConfig)
        except ConfigError as e:
            print(e, file=sys.stderr)
            failed = True
        else:
            print(f"{path}: ok (study)")
    return 2 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--config", type=Path, default=None, help="study YAML (default: benchmarks/stress/grid.yaml)"
    )
    ap.add_argument("--full", action="store_true", help="use benchmarks/stress/grid_full.yaml")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the tables and PNG")
    ap.add_argument("--out", type=Path, default=None, help="results directory (default: the config's out)")
    ap.add_argument("--check", nargs="+", type=Path, metavar="FILE", help="only validate these study files")
    args = ap.parse_args(argv)
    if args.check:
        return check(args.check)
    path = args.config or HERE / ("grid_full.yaml" if args.full else "grid.yaml")
    try:
        study = load_model(path, StudyConfig)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    out = args.out or Path(study.out)
    if not args.report_only:
        run_grid(study, out)
    from benchmarks.stress.report import write_report

    for p in write_report(study, load_runs(out / "runs.jsonl"), out):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
