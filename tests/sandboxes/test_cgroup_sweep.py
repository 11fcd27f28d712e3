"""The sweep of stale sandbox cgroups survives cgroups that vanish while it walks the hierarchy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes import cgroup


def test_a_cgroup_removed_during_the_walk_does_not_fail_the_sandbox_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A make-test run beside a Docker engine failed a sandbox start with FileNotFoundError: the deep glob walked
    into a container's cgroup as the engine removed it. The walk is replayed here on a fake hierarchy (this
    process cannot remove a real cgroup at a chosen moment): the deep pattern's walk raises as it did, the
    other patterns' stale cgroups (owners dead) are still removed, and a live owner's is kept."""
    dead, alive = 2**22 + 1, os.getpid()  # above pid_max's default: no such process
    stale = tmp_path / "pids" / f"{cgroup._PREFIX}{dead}-0"
    live = tmp_path / "pids" / f"{cgroup._PREFIX}{alive}-0"
    stale.mkdir(parents=True)
    live.mkdir()
    monkeypatch.setattr(cgroup, "_ROOT", tmp_path)
    real_glob = Path.glob

    def glob(self: Path, pattern: str):  # noqa: ANN202
        if pattern.startswith("*/*/*/"):
            raise FileNotFoundError(2, "No such file or directory", str(self / "pids/docker/gone"))
        return real_glob(self, pattern)

    monkeypatch.setattr(Path, "glob", glob)
    cgroup._sweep_stale()
    assert not stale.exists() and live.exists()
