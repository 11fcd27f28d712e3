"""Record a pipeline's report (examples/pipeline.py writes ROOT/report.json and report.txt) as a results file.

    .venv/bin/python -m scripts.docs.record_run runs/tiny_tir --name main_job --command "make run"

writes benchmarks/results/NAME.json (the report as the run wrote it, plus when, where and from which commit it
ran), NAME.md (the report's own text and a table) and NAME.png (the RL stage's curves), so the docs and the README quote the run from a file and
never by hand. `--started` and `--load-start` carry what the caller saw when the run began.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from scripts.docs.figures import RESULTS, ROOT

ROWS = (
    ("accuracy", "accuracy"),
    ("tool-use rate", "tool_use_rate"),
    ("turns per episode", "turns_per_episode"),
    ("eval tokens/s", "tokens_per_s"),
)


def record(
    root: Path,
    name: str,
    command: str,
    started: str | None,
    load_start: str | None,
    commit: str | None = None,
) -> dict:
    report = json.loads((root / "report.json").read_text())
    text = (root / "report.txt").read_text()
    m = re.search(r"RL ([\d.]+) min; total ([\d.]+) min", text)
    if m is None:
        raise SystemExit(
            f"{root / 'report.txt'}: no 'RL N min; total N min' line: is it a pipeline's report?"
        )
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out = {
        "command": command,
        "recorded": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "started": started,
        "commit": commit or head.stdout.strip() or None,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_at_start": load_start,
        "load_average_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "minutes_rl": float(m[1]),
        "minutes_total": float(m[2]),
        "report": report,
        "report_text": text.strip(),
    }
    curves = next(root.glob("*/curves.png"), None)  # agent-rl plot of the RL stage, when the pipeline drew it
    if curves is not None:
        shutil.copyfile(curves, RESULTS / f"{name}.png")
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(out))
    return out


def markdown(r: dict) -> str:
    b, a = r["report"]["before"], r["report"]["after"]
    lines = [
        f"# `{r['command']}`: held-out {a['env']}/{a['split']}, {a['tasks']} tasks",
        "",
        f"Run at commit {r['commit']} on {r['machine']}, started {r['started'] or 'unknown'} (load average "
        f"{r['load_average_at_start'] or 'unknown'}), recorded {r['recorded']} (load average "
        f"{r['load_average_at_end']}). RL {r['minutes_rl']:.1f} min, {r['minutes_total']:.1f} min in all.",
        "",
        "| held-out | warm start | after RL |",
        "|---|---|---|",
        *[f"| {label} | {b[key]:.3f} | {a[key]:.3f} |" for label, key in ROWS],
        "",
        "What the run printed:",
        "",
        "```",
        r["report_text"],
        "```",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.docs.record_run", description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="the pipeline's directory (holds report.json and report.txt)")
    p.add_argument("--name", required=True, help="results file name: benchmarks/results/NAME.{json,md}")
    p.add_argument("--command", required=True, help="the command that ran it, as a user would type it")
    p.add_argument("--started", default=None, help="when it started (UTC)")
    p.add_argument("--load-start", default=None, help="the load average when it started")
    p.add_argument("--commit", default=None, help="the commit the run ran (default: HEAD now)")
    args = p.parse_args(argv)
    out = record(args.root, args.name, args.command, args.started, args.load_start, args.commit)
    print(f"wrote benchmarks/results/{args.name}.json and .md ({out['minutes_total']} min run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
