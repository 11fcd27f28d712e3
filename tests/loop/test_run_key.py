"""A training run with engine server processes under the run's key: it trains, its servers refuse strangers, and
the key is never written down: not in the run dir (resolved_config.json included), not in the run's output or
its servers' logs, not on any process's command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from loop_paths import ROOT

from sandboxes.auth import KEY_ENV

KEY = "run-key-" + "r" * 40


def cmdlines() -> list[bytes]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((d / "cmdline").read_bytes())
            except OSError:
                continue
    return out


def status_of(url: str, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, json.dumps({"input_ids": [1]}).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_run_with_engine_servers_trains_under_its_key_and_never_writes_the_key_down(
    tiny_model_dir, tmp_path
):
    run_dir, started = tmp_path / "run", time.time()
    sets = [f"model.path={tiny_model_dir}", f"logging.run_dir={run_dir}", "engines.count=2",
            "engines.weight_sync=memory", "train.steps=3", "checkpoint.every=2", "buffer.max_staleness=0"]  # fmt: skip
    cmd = [sys.executable, "-m", "agent_rl.cli", "train", str(ROOT / "recipes" / "tiny_tir_smoke.yaml")]
    cmd += [a for s in sets for a in ("--set", s)]
    env = {**os.environ, KEY_ENV: KEY}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    members = run_dir / "engines" / "members.json"
    deadline = time.monotonic() + 900
    while not (members.exists() and (run_dir / "batches.jsonl").exists()):  # servers up, a step trained
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no step within 900 s"
        time.sleep(0.2)
    urls = [m["name"] for m in json.loads(members.read_text())["members"]]
    assert len(urls) == 2 and not any(KEY.encode() in c for c in cmdlines())  # the key travels by environment
    refused = [status_of(u + "/generate", {}) for u in urls]
    wrong = [status_of(u + "/generate", {"Authorization": "Bearer nope"}) for u in urls]
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    assert refused == wrong == [401, 401]
    assert len((run_dir / "batches.jsonl").read_text().splitlines()) == 3  # weights went by /dev/shm: allowed
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert run_dir / "resolved_config.json" in files
    logs = [
        p for p in Path(tempfile.gettempdir()).glob("agent_rl_server_*.log") if p.stat().st_mtime >= started
    ]
    assert logs, "the engine servers' logs"
    leaked = [str(p) for p in files + logs if KEY.encode() in p.read_bytes()]
    assert leaked == [] and KEY not in out + err
