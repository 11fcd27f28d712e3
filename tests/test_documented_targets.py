"""The make targets the README and docs/ document are the ones scripts/fresh_clone_targets.py knows: each is
run from a fresh clone (RUN) or listed with the reason it is not (NOT_RUN), and each is a Makefile target."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `make X` in a code span, or at the start of a line in a code block
MENTION = re.compile(r"(?:`|^\s*)make ([a-z][a-z0-9-]*)", re.MULTILINE)


def _script():
    spec = importlib.util.spec_from_file_location(
        "fresh_clone_targets", ROOT / "scripts" / "fresh_clone_targets.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented() -> dict[str, str]:
    """target -> the first file that mentions it."""
    found: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in MENTION.findall(path.read_text()):
            found.setdefault(target, str(path.relative_to(ROOT)))
    return found


def _makefile_targets() -> set[str]:
    rule = re.compile(r"^([a-z][a-z0-9-]*)\s*:(?!=)", re.MULTILINE)  # `name:` but not `name := value`
    return set(rule.findall((ROOT / "Makefile").read_text()))


def test_the_mention_pattern_reads_code_not_prose():
    text = "Run `make test`; we make sure\n```\nmake run     # the main job\n```\nto make it so"
    assert MENTION.findall(text) == ["test", "run"]


def test_every_documented_target_is_run_from_a_fresh_clone_or_says_why_not():
    s = _script()
    listed = set(s.RUN) | set(s.NOT_RUN)
    missing = {t: f for t, f in _documented().items() if t not in listed}
    assert not missing, (
        "make targets the docs mention that scripts/fresh_clone_targets.py does not list (add each to RUN, or "
        f"to NOT_RUN with the reason): {missing}"
    )
    assert not set(s.RUN) & set(s.NOT_RUN)


def test_every_documented_target_exists_in_the_makefile():
    absent = {t: f for t, f in _documented().items() if t not in _makefile_targets()}
    assert not absent, f"documented make targets the Makefile does not have: {absent}"
