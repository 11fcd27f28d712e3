"""benchmarks/host_reads.py end to end on CPU: one command writes its json and md, and what it measures holds — the
step's own reads do not grow with its micro-batches, the log-probs read twice per forward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy  # four learner ranks built and stepped three times each: ~15 s on two cores
def test_the_benchmark_writes_its_counts_and_the_steps_own_reads_do_not_grow_with_micro_batches(tmp_path) -> None:
    out = tmp_path / "host_reads"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_reads.py"), "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[4/4]" in r.stdout  # progress, one line per layout
    result = json.loads(out.with_suffix(".json").read_text())
    assert "| layout | forwards |" in out.with_suffix(".md").read_text()
    own = set()
    for row in result["layouts"]:
        in_logprobs = sum(n for site, n in row["sites"].items() if "hf_logprobs" in site or "masking" in site)
        assert in_logprobs == 2 * row["forwards"], row
        own.add(row["reads"] - in_logprobs)
    assert len(own) == 1, result["layouts"]
    assert [row["forwards"] for row in result["layouts"]] == [1, 4, 8, 16]
