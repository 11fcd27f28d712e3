"""An engine server started by the trainer stops when the trainer dies, even by SIGKILL (no orphan holds a core)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PARENT = """
import sys
from agent_rl.engines.launch import launch_server
h = launch_server(sys.argv[1])
print(h.process.pid, flush=True)
sys.stdin.read()  # wait to be killed
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; only its reaping is pending
        return f.read().split(") ")[1][0] != "Z"


def test_engine_server_exits_when_its_parent_is_sigkilled(tiny_model_dir: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tiny_model_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    server_pid = int(parent.stdout.readline())
    assert _alive(server_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 60  # a bound for a hung test, not a speed assertion: it checks every 1 s
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(server_pid)
    if alive:
        os.kill(server_pid, signal.SIGKILL)
    assert not alive, "the engine server outlived the process that started it"
