"""examples/pipeline.py over a finished run: `make run` a second time says that it reports the run already there
(every stage is kept) and how to start a new one, instead of reprinting an old result as if it were new."""

from __future__ import annotations

from pathlib import Path

from examples.pipeline import finished_note


def test_a_finished_run_is_named_with_the_way_to_start_a_new_one(tmp_path: Path) -> None:
    assert finished_note(tmp_path) is None  # nothing there yet
    (tmp_path / "rl").mkdir()
    assert finished_note(tmp_path) is None  # an interrupted run: it continues, nothing to say
    (tmp_path / "report.json").write_text("{}")
    note = finished_note(tmp_path)
    assert note is not None and note.startswith(f"{tmp_path}: a finished run is there")
    assert "--fresh deletes it and starts a new run" in note
