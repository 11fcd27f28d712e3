"""Where and on what a results file was measured: commit, CPU model and the flags torch's kernels pick by, cores,
load average before and after, package versions, date. Every results file the harness writes carries one
`meta` block of this shape (docs/benchmarks/harness.md, "Results files").

Paths in results are relative to the checkout (`portable`): results are committed, and
tests/test_portable_tree.py checks that no committed file names a path of one machine.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
import sys
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
    only, so a checkout in /work leaves `tir/workers=1` as it is (no path character before or after the match)."""
    for path, short in ((ROOT, "."), (ROOT.parent, "..")):
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


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Provenance:
    """Taken at a benchmark's start (`Provenance()`), closed at its end (`.meta()` adds the load after)."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.started = dt.datetime.now(dt.UTC)
        self.load_before = load_average()
        self.commit = commit()  # the code that runs: a long benchmark's tree may change before it ends
        argv = command if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
        self.command = portable(" ".join(argv))

    def meta(self) -> dict:
        return {
            "command": self.command,
            "date": self.started.isoformat(timespec="seconds"),
            "commit": self.commit,
            "cpu": cpu(),
            "load_before": self.load_before,
            "load_after": load_average(),
            "elapsed_s": round((dt.datetime.now(dt.UTC) - self.started).total_seconds(), 1),
            "versions": versions(),
        }


def describe(meta: dict) -> str:
    """The provenance block in one line for a results page: '2026-12-06 10:00 UTC, commit abc1234, AMD EPYC ... (2
    cores), load 0.4 before / 1.2 after'."""
    date = meta["date"].replace("T", " ").replace("+00:00", " UTC")
    cpu = meta["cpu"]
    return (f"{date}, commit {meta['commit']}, {cpu['model']} ({cpu['cores']} cores), "
            f"load {meta['load_before'][0]:.1f} before / {meta['load_after'][0]:.1f} after")  # fmt: skip
