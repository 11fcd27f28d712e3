"""Nothing machine-specific is committed: no symbolic link that points outside the repository (a fresh clone
breaks on it, as `make test-vllm` did on a committed `.venv-vllm` link into a developer's folder), and no
text file that names an absolute path of the machine it was written on (a home or work folder, or this
checkout's own path). Benchmarks write paths relative to the checkout (benchmarks/bench_paths.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
# Folders that hold one user's or one machine's files: the root of a home (root's, /home/NAME, macOS's
# /Users/NAME) and the shared work folder of the machines this project is developed on.
MACHINE_DIRS = ("root", "home", "Users", "work")
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:" + "|".join(MACHINE_DIRS) + r")/[^\s'\"`)\],]*")
# Paths that name no machine: probes of what a sandbox hides, true of any Linux host.
ALLOWED = {
    "tests/sandboxes/sandbox_adversarial.py": {"/root/.bash_history", "/home/x"},
}


def _tracked() -> list[tuple[str, str, str]]:
    """(mode, object id, path) of every file git tracks here."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing committed to check")
    out = subprocess.run(
        ["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    rows = []
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, oid, _stage = meta.split()
        rows.append((mode, oid, path))
    return rows


def _outside(link: str, target: str) -> bool:
    """Whether a link at `link` (repo-relative) pointing to `target` leaves the repository."""
    if os.path.isabs(target):
        return True
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return resolved == ".." or resolved.startswith("../")


def test_the_link_check_sees_a_link_leave_the_repository():
    assert _outside(".venv-vllm", "/work/wt/.venv-vllm")
    assert _outside("docs/shared", "../../shared")
    assert not _outside("docs/img/logo.png", "../assets/logo.png")


def test_no_committed_link_points_outside_the_repository():
    links = [(path, oid) for mode, oid, path in _tracked() if mode == "120000"]
    bad = []
    for path, oid in links:
        target = subprocess.run(
            ["git", "cat-file", "blob", oid], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        if _outside(path, target):
            bad.append(f"{path} -> {target}")
    assert not bad, (
        "committed links that leave the repository (git rm them; ignore local ones):\n" + "\n".join(bad)
    )


def _machine_paths(text: str, own: tuple[str, ...]) -> set[str]:
    found = set(MACHINE_PATH.findall(text))
    found |= {o for o in own if o in text}
    return found


def test_the_path_check_sees_a_machine_path():
    here = (str(ROOT),)
    assert _machine_paths("--trl-venv " + "/wo" + "rk/wt/trl/.venv-trl", here) == {
        "/" + "work/wt/trl/.venv-trl"
    }
    assert _machine_paths("model: " + "/ho" + "me/ana/models/x", here) == {"/" + "home/ana/models/x"}
    assert str(ROOT) in _machine_paths(f"ran in {ROOT}/runs", here)
    assert not _machine_paths("--model-dir ../models/smollm2 /usr/bin/python3 ~/work/x a/home/b", ())


def test_no_committed_text_file_names_a_path_of_one_machine():
    own = tuple(p for p in {str(ROOT), str(Path.home())} if p.count("/") >= 2)  # not "/" or "/root" alone
    bad = []
    for mode, _oid, path in _tracked():
        if mode == "120000" or not (ROOT / path).is_file() or path == SELF:
            continue  # this file names such paths to test the check
        data = (ROOT / path).read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        found = _machine_paths(data.decode(errors="replace"), own) - ALLOWED.get(path, set())
        bad += [f"{path}: {p}" for p in sorted(found)]
    assert not bad, (
        "absolute paths of one machine in committed files (write them relative to the checkout, or as a "
        "placeholder such as DIR):\n" + "\n".join(bad)
    )
