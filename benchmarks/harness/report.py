"""Write a results file and its markdown: one writer for every benchmark.

`write(name, data, out)` writes `out/NAME.json` (the data, with the provenance block under `meta`) and
`out/NAME.md` (the markdown the benchmark renders from that JSON alone, so it can be regenerated from the
committed file: `render(json) -> str`). `results_dir` decides where: the committed results for a full run,
a scratch folder under runs/ for a smoke or quick run unless `--out` names one, so a smoke run never writes
over committed results.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.harness.provenance import ROOT, portable

RESULTS = ROOT / "benchmarks" / "results"
SCRATCH = ROOT / "runs" / "bench"


def results_dir(out: str | Path | None, *, scratch: bool, name: str) -> Path:
    """Where a benchmark writes: `out` when given; else runs/bench/NAME for a smoke/quick run (`scratch`),
    benchmarks/results for a full one."""
    if out is not None:
        return Path(out)
    return SCRATCH / name if scratch else RESULTS


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table (None -> '-')."""

    def cell(x: object) -> str:
        return "-" if x is None else str(x)

    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell(x) for x in row) + " |" for row in rows),
    ]


def write(name: str, data: dict, out: Path, render: Callable[[dict], str], quiet: bool = False) -> Path:
    """out/NAME.json and out/NAME.md (render(data)); returns the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(portable(json.dumps(data, indent=1)) + "\n")
    text = render(data)
    (out / f"{name}.md").write_text(portable(text))
    if not quiet:
        print(text)
    return path


def results_file(value: str) -> Path:
    """`--from-results`'s type: a results file that exists and holds JSON, else argparse's one-line error."""
    path = Path(value)
    try:
        json.loads(path.read_text())
    except OSError as e:
        raise argparse.ArgumentTypeError(
            f"{value}: cannot read it ({e.strerror}): name a results .json file"
        ) from e
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"{value}: not a results file (JSON error at line {e.lineno}: {e.msg})"
        ) from e
    return path


def results_args(parser: argparse.ArgumentParser, name: str) -> None:
    """The two options of every benchmark on the harness: `--out DIR` and `--from-results FILE`."""
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results)")
    parser.add_argument("--from-results", type=results_file, default=None,
                        help=f"run nothing: rewrite {name}.{{json,md}} (into --out) from this results file alone")  # fmt: skip


class _Quick(argparse.Action):
    """`--quick`: sets `quick` and every option of `sizes` to its machinery-check value."""

    def __init__(self, option_strings: list[str], dest: str, sizes: dict, **kwargs) -> None:
        self.sizes = sizes
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True)
        for key, value in self.sizes.items():
            setattr(namespace, key, value)


def quick_args(parser: argparse.ArgumentParser, **sizes: object) -> None:
    """`--quick` of a benchmark on the harness: a machinery check (every benchmark's runs in CI, tests/benchmarks/
    test_quick_runs.py), the options in `sizes` set to these values (an option given after `--quick` wins); the
    benchmark writes it under runs/bench/NAME unless `--out` names a folder (`results_dir(args.out,
    scratch=args.quick, ...)`), never over the committed results."""
    shown = ", ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in sizes.items())
    parser.add_argument("--quick", action=_Quick, sizes=sizes,
                        help=f"a machinery check ({shown}); results under runs/bench unless --out")  # fmt: skip


def rewrite(
    args: argparse.Namespace,
    name: str,
    render: Callable[[dict], str],
    summarise: Callable[[dict], dict] = lambda d: {},
) -> bool:
    """With `--from-results FILE`: NAME.{json,md} rewritten into `--out` from that file alone (its figures recomputed
    from the runs it keeps by `summarise(data) -> the keys it replaces`), and True; without it, False."""
    if args.from_results is None:
        return False
    data = json.loads(Path(args.from_results).read_text())
    write(name, data | summarise(data), results_dir(args.out, scratch=False, name=name), render)
    return True


def subplots(*args, **kwargs):
    """matplotlib's `plt.subplots(...)` drawn headless (the Agg backend): (figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """A figure of `subplots` laid out, written to `path` and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def time_curves(
    cells: Sequence[dict],
    name: Callable[[dict], str],
    path: Path,
    title: str,
    ylabel: str = "held-out accuracy",
    figsize: tuple[float, float] = (12, 4.5),
    hline: tuple[float, str] | None = None,
) -> None:
    """Every run's accuracy curve in two panels, on training time (`curve`) and on whole-process time
    (`curve_process`; a panel says so where runs did not record it), one colour per cell (`name(run)`, labelled on
    seed 0); `hline` (value, label): a reference line on both. Written to `path`."""
    fig, axes = subplots(1, 2, figsize=figsize, sharey=True)
    colors: dict[str, str] = {}
    for ax, key, xlabel in zip(axes, ("curve", "curve_process"),
                               ("training wall time (s)", "whole-process wall time (s)"), strict=True):  # fmt: skip
        for r in cells:
            n = name(r)
            c = colors.setdefault(n, f"C{len(colors)}")
            if key not in r:  # runs recorded before the process clock was
                ax.set_title("whole-process time not recorded by these runs", fontsize=9)
                continue
            t, a = zip(*r[key], strict=True)
            ax.plot(t, a, color=c, alpha=0.8, marker=".", label=n if r["seed"] == 0 else None)
        if hline is not None:
            ax.axhline(hline[0], color="k", ls="--", lw=0.8, label=hline[1])
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[0].legend()
    fig.suptitle(title)
    save_figure(fig, path)


def log(msg: str) -> None:
    """A progress line with the time of day, flushed (a benchmark's output goes to a log file)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
