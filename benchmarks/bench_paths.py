"""Results name paths relative to the checkout (`.` the repository, `..` the folder it sits in), never as
absolute paths of the machine that ran them: results are committed, and tests/test_portable_tree.py checks
that no committed file names a path of one machine."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def portable(text: str) -> str:
    """`text` with this checkout's absolute path written `.` and its parent folder's `..`."""
    return text.replace(str(ROOT), ".").replace(str(ROOT.parent), "..")
