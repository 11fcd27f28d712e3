"""agent_rl/thread_names.py: the OS sees the name a thread gives itself (what a /proc profile groups by)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from agent_rl.thread_names import MAX_BYTES, name_this_thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl names: Linux")
def test_a_thread_named_natively_shows_that_name_in_proc() -> None:
    seen: dict[str, object] = {}

    def run() -> None:
        seen["set"] = name_this_thread("agent-rl-engine-and-more")  # longer than the kernel keeps
        seen["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen["set"] is True
    assert seen["comm"] == "agent-rl-engine-and-more"[:MAX_BYTES]
