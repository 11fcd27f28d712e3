"""The neighbour import of the benchmarks run as scripts (`python benchmarks/x.py` puts only benchmarks/ on
sys.path): puts the checkout on sys.path and re-exports benchmarks.harness.provenance's ROOT and `portable`
(results name paths relative to the checkout; tests/test_portable_tree.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.provenance import ROOT, portable  # noqa: E402

__all__ = ["ROOT", "portable"]
