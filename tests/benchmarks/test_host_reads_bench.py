"""benchmarks/host_reads.py end to end on CPU: one command writes its json and md, and what it measures holds — the
step's own reads do not grow with its micro-batches, the log-probs read twice per forward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy  # six learner ranks built and stepped twice each: ~25 s on two cores
def test_the_benchmark_writes_its_counts_and_the_steps_own_reads_do_not_grow_with_micro_batches(
    tmp_path,
) -> None:
    out = tmp_path / "host_reads"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_reads.py"), "--megatron", "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[6/6]" in r.stdout  # progress, one line per cell
    result = json.loads(out.with_suffix(".json").read_text())
    assert "| layout | forwards |" in out.with_suffix(".md").read_text()
    torch_rows = [row for row in result["layouts"] if row["backend"] == "torch"]
    (megatron,) = (row for row in result["layouts"] if row["backend"] == "megatron")
    assert megatron["forwards"] == 8  # exact OPOB: one forward per trajectory
    own = set()
    for row in torch_rows:
        in_logprobs = sum(n for site, n in row["sites"].items() if "hf_logprobs" in site or "masking" in site)
        assert in_logprobs == 2 * row["forwards"], row
        own.add(row["reads"] - in_logprobs)
    assert len(own) == 1, result["layouts"]
    proxy = [row for row in torch_rows if "ghost" not in row["layout"]]
    (ghost,) = (row for row in torch_rows if "ghost" in row["layout"])
    assert [row["forwards"] for row in proxy] == [1, 4, 8, 16]
    # exact OPOB with ghost norms reads as proxy OPOB's same layout: its norms come from hooks, not from reads
    (same_layout,) = (row for row in proxy if row["rows_per_micro_batch"] == ghost["rows_per_micro_batch"])
    assert (ghost["reads"], ghost["forwards"]) == (same_layout["reads"], same_layout["forwards"])
