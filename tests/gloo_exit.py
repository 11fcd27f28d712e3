"""Ending a spawned gloo test worker without the abort CI saw at interpreter exit (shared by test folders)."""

from __future__ import annotations

import multiprocessing.util
import os
import sys

import torch.distributed as dist


def exit_worker() -> None:
    """Leave the gloo group together, then end the process without interpreter teardown.

    CI saw rank 0 (the TCPStore host) abort with "terminate called without an active exception"
    after its work was done: C++ static destruction met a store/gloo thread still joinable. The
    results are on disk by now, so nothing is lost by skipping teardown; an exception in the
    worker never gets here and is reported by mp.spawn as usual.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips multiprocessing's finalizers: semaphores made here would be reported leaked at exit
    multiprocessing.util._run_finalizers(0)
    os._exit(0)
