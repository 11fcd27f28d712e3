"""Where and on what a results file was measured: commit, CPU model and the flags torch's kernels pick by, cores,
load average before and after, package versions, date. Every results file the harness writes carries one
`meta` block of this shape (docs/benchmarks/harness.md, "Results files").

Paths in results are relative to the checkout (`portable`): results are committed, and
tests/test_portable_tree.py checks that no committed file names a path of one machine.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the CPU flags that decide which kernels torch and the engines run (the rest of /proc/cpuinfo's list does not)
KERNEL_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "sve",
    "asimd",
)
PACKAGES = ("agent-rl", "torch", "transformers", "trl", "vllm", "megatron-core")


def portable(text: str) -> str:
    """`text` with this checkout's absolute path written `.` and its parent folder's `..`: whole path prefixes
    only, so a checkout in /work leaves `tir/workers=1` as it is (no path character before or after the match).
    A checkout in the system's temporary folder (a clone in /tmp) keeps other /tmp paths whole: they are scratch
    folders, not its siblings, and a results file rewritten from there must read as it was written."""
    pairs = [(ROOT, ".")] + ([(ROOT.parent, "..")] if ROOT.parent != Path(tempfile.gettempdir()) else [])
    for path, short in pairs:
        text = re.sub(rf"(?<![\w.-]){re.escape(str(path))}(?![\w.-])", short, text)
    return text


def commit() -> str:
    """Short commit of the checkout, '+dirty' when tracked files differ from it; 'unknown' outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def cpu() -> dict:
    """{'model': ..., 'flags': [the KERNEL_FLAGS present], 'cores': os.cpu_count()}."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "arch": platform.machine(), "flags": [f for f in KERNEL_FLAGS if f in flags],
            "cores": os.cpu_count()}  # fmt: skip


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def versions_of(python: Path) -> dict[str, str]:
    """`versions()` as another interpreter sees them: a benchmark's second venv (TRL's, .venv-trl), whose side of the
    comparison runs there. {} where it cannot be run (the benchmark then fails on its own, saying why)."""
    code = "import json, sys; sys.path.insert(0, sys.argv[1]); from provenance import versions; print(json.dumps(versions()))"
    try:
        out = subprocess.run([str(python), "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                             check=True, timeout=120).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    return json.loads(out)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Provenance:
    """Taken at a benchmark's start (`Provenance()`), closed at its end (`.meta()` adds the load after)."""

    def __init__(self, command: list[str] | None = None, venvs: dict[str, Path] | None = None) -> None:
        """`venvs`: the other interpreters a side of the comparison runs in, by name ({"trl": .venv-trl's python}):
        their versions go in `meta()["venvs"]`."""
        self.started = dt.datetime.now(dt.UTC)
        self.load_before = load_average()
        self.commit = commit()  # the code that runs: a long benchmark's tree may change before it ends
        argv = command if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
        self.command = portable(" ".join(argv))
        self.venvs = {name: versions_of(python) for name, python in (venvs or {}).items()}

    def meta(self) -> dict:
        meta = {
            "command": self.command,
            "date": self.started.isoformat(timespec="seconds"),
            "commit": self.commit,
            "cpu": cpu(),
            "load_before": self.load_before,
            "load_after": load_average(),
            "elapsed_s": round((dt.datetime.now(dt.UTC) - self.started).total_seconds(), 1),
            "versions": versions(),
        }
        return meta | ({"venvs": self.venvs} if self.venvs else {})


def describe(meta: dict) -> str:
    """The provenance block in one line for a results page: '2026-12-06 10:00 UTC, commit abc1234, AMD EPYC ... (2
    cores), load 0.4 before / 1.2 after'."""
    date = meta["date"].replace("T", " ").replace("+00:00", " UTC")
    cpu = meta["cpu"]
    return (f"{date}, commit {meta['commit']}, {cpu['model']} ({cpu['cores']} cores), "
            f"load {meta['load_before'][0]:.1f} before / {meta['load_after'][0]:.1f} after")  # fmt: skip
