"""`agent-rl data pull` against a local HTTP server laid out as GitHub's raw files ({repo}/{commit}/{path}),
serving the project's data snapshot (../shared/data): files are verified by sha256 before they reach the
cache, a mismatch keeps nothing, and the loaders then read the cache."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from agent_rl.cli import main
from agent_rl.errors import EXIT_USER
from agent_rl.tools import data_pull


@pytest.fixture
def mirror(shared_data, tmp_path):
    """A local server with every pinned file at /{repo}/{commit}/{path}; yields (base url, served dir)."""
    served = tmp_path / "served"
    for ds in data_pull.DATASETS.values():
        for f in ds.files:
            dest = served / f.repo / f.commit / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(shared_data / f.local)
    handler = functools.partial(_QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_every_pinned_file_matches_its_source_txt(shared_data):
    for ds in data_pull.DATASETS.values():
        for f in ds.files:
            source = (shared_data / f.local).parent / "SOURCE.txt"
            text = source.read_text()
            assert f"{f.sha256}  {Path(f.local).name}" in text, (source, f.local)
            assert f.repo in text and f.commit in text and f.path.rsplit("/", 1)[-1] in text, (source, f.path)
            assert data_pull.sha256_of(shared_data / f.local) == f.sha256


def test_pull_verifies_caches_and_the_loaders_read_the_cache(mirror, tmp_path, monkeypatch, capsys):
    base, _ = mirror
    cache = tmp_path / "cache"
    assert main(["data", "pull", "aime2025", "gsm8k", "--root", str(cache), "--base-url", base]) == 0
    err = capsys.readouterr().err
    assert "aime2025: 30 rows -> 30 tasks (frac_formfeeds_fixed=6" in err  # the loader's fixes, reported
    for f in data_pull.DATASETS["aime2025"].files + data_pull.DATASETS["gsm8k"].files:
        assert data_pull.sha256_of(cache / f.local) == f.sha256
    assert not list(cache.rglob(".*.part-*"))
    # Again: nothing is downloaded, every file is checked and reported as cached.
    assert main(["data", "pull", "aime2025", "--root", str(cache), "--base-url", base + "/nowhere"]) == 0
    assert "aime2025/simpletir_aime25.parquet: cached (sha256 ok)" in capsys.readouterr().err
    # The loaders find the pulled files through $AGENT_RL_DATA (the cache `pull` writes by default).
    import envs
    from envs.datasets import load_split
    from envs.spec import DataSource

    monkeypatch.setenv("AGENT_RL_DATA", str(cache))
    assert data_pull.cache_dir() == cache
    tasks, report = load_split(DataSource(dataset="aime2025"), envs.spec.default_data_root())
    assert len(tasks) == 30 and report.frac_formfeeds_fixed == 6
    assert all("\x0c" not in t.problem for t in tasks)


def test_a_checksum_mismatch_keeps_nothing_and_is_one_line(mirror, tmp_path, capsys):
    base, served = mirror
    f = data_pull.DATASETS["aime2024"].files[0]
    bad = served / f.repo / f.commit / f.path
    bad.unlink()
    bad.write_bytes(b"not the pinned parquet\n")
    cache = tmp_path / "cache"
    code = main(["data", "pull", "aime2024", "--root", str(cache), "--base-url", base])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("agent-rl:")]
    assert code == EXIT_USER and len(lines) == 1
    assert f"does not match the pinned {f.sha256}" in lines[0] and "was not kept" in lines[0]
    assert not (cache / f.local).exists() and not list(cache.rglob(".*.part-*"))


def test_a_missing_file_and_an_unknown_name_are_one_line(mirror, tmp_path, capsys):
    base, served = mirror
    shutil.rmtree(served / "openai")
    assert main(["data", "pull", "gsm8k", "--root", str(tmp_path), "--base-url", base]) == EXIT_USER
    assert "HTTP 404" in capsys.readouterr().err
    assert main(["data", "pull", "imagenet", "--root", str(tmp_path)]) == EXIT_USER
    assert "unknown data set(s) imagenet: choose from aime2024" in capsys.readouterr().err


def test_a_loader_logs_its_fix_report_once_per_split(shared_data, caplog):
    import logging

    from envs.datasets import load_split
    from envs.spec import DataSource

    load_split.cache_clear()
    with caplog.at_level(logging.INFO, logger="envs.datasets"):
        for _ in range(3):  # envs are made per episode: the report must not repeat
            load_split(DataSource(dataset="aime2024"), shared_data)
    lines = [r.getMessage() for r in caplog.records if r.name == "envs.datasets"]
    assert lines == ["data aime2024: 30 rows -> 30 tasks (padded_answers_fixed=7)"]
