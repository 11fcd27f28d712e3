"""Write a results file and its markdown: one writer for every benchmark.

`write(name, data, out)` writes `out/NAME.json` (the data, with the provenance block under `meta`) and
`out/NAME.md` (the markdown the benchmark renders from that JSON alone, so it can be regenerated from the
committed file: `render(json) -> str`). `results_dir` decides where: the committed results for a full run,
a scratch folder under runs/ for a smoke or quick run unless `--out` names one, so a smoke run never writes
over committed results.
"""

from __future__ import annotations

import json
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
