"""Give the calling thread its name at the OS level (what `top -H`, `ps -L` and /proc/PID/task/TID/comm show).

Python's `threading.Thread(name=...)` stays inside the interpreter (Python 3.11 does not pass it to the OS),
so a profile read from /proc (benchmarks/_core_profile.py) cannot tell the engine thread from the rollout
loop. Threads a named thread starts later (torch's intra-op workers) inherit the name, so their CPU time is
counted to the same role. Linux only (prctl PR_SET_NAME, 15 bytes); elsewhere, or without libc, a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_SET_NAME = 15
MAX_BYTES = 15  # the kernel keeps 16 bytes with the terminating NUL


def name_this_thread(name: str) -> bool:
    """Set the OS name of the calling thread to `name` (cut to 15 bytes); True if it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return False
    raw = name.encode("utf-8", "replace")[:MAX_BYTES]
    return libc.prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
