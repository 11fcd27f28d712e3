"""`agent-rl prepare smollm2` writes its directory whole or not at all (agent_rl/tools/pretrained.py `_write_whole`):
a run killed half-way leaves nothing a later run would take as done, and two runs at once (two test workers
preparing runs/smollm2) end with one complete directory. The conversion itself is left out (it needs the wheel and
~30 s): the writer is given a function that writes the two files a complete directory has."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_rl.errors import UserError
from agent_rl.tools.pretrained import _complete, _write_whole


def _writer(tag: str):
    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_text(tag)
        (folder / "config.json").write_text("{}")

    return write


def _hidden(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_a_write_that_fails_half_way_leaves_no_directory_and_no_scratch(tmp_path: Path) -> None:
    def half(folder: Path) -> None:
        (folder / "model.safetensors").write_text("part")  # config.json never comes
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _write_whole(tmp_path / "smollm2", half)
    assert not (tmp_path / "smollm2").exists() and _hidden(tmp_path) == []
    out = _write_whole(tmp_path / "smollm2", _writer("a"))  # the next run writes it whole
    assert _complete(out) and (out / "model.safetensors").read_text() == "a"
    assert out.stat().st_mode & 0o777 == 0o755  # readable by others, as a folder made by mkdir is


def test_an_empty_folder_is_taken_over_and_a_complete_one_is_kept(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert _complete(_write_whole(tmp_path / "m", _writer("a")))
    # a second writer that finishes after the first (two workers at once) keeps the first's directory
    out = _write_whole(tmp_path / "m", _writer("b"))
    assert (out / "model.safetensors").read_text() == "a" and _hidden(tmp_path) == []


def test_a_partial_directory_left_by_an_older_run_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")  # weights missing
    with pytest.raises(UserError, match=r"m exists but is not a complete model .* remove it and run again"):
        _write_whole(tmp_path / "m", _writer("a"))
    assert _hidden(tmp_path) == []
