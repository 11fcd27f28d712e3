"""SIGTERM during training (a scheduler's time limit or preemption, `docker stop`, `kill`): stop at the next step
boundary with a checkpoint, so that `--resume` loses nothing.

While `StopOnSigterm` is entered (the training loop's steps), the first SIGTERM asks the loop to stop: the step in
progress finishes (its batch is trained, its weights published) and is saved like any checkpoint, then the run
closes what it started and `agent-rl train` exits 143 with one line naming the checkpoint and the command that
continues it. A second SIGTERM, or Ctrl-C, stops at once, as before (`--resume` then continues from the last
periodic checkpoint). Outside the loop (start-up, shutdown) SIGTERM unwinds at once (`errors.run`).

The step is not cut short: a learner step cannot be, and cutting the wait for rollouts would lose the groups the
batch has taken from the buffer. So a scheduler's grace period must cover one step (SLURM: `--signal=B:TERM@120`
with `exec agent-rl train ...` in the batch script; Kubernetes: terminationGracePeriodSeconds). The signal must
reach the trainer alone: its engine servers, sandboxes and learner ranks are needed to finish the step (they
stop with it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from agent_rl.errors import Terminated, die_if_forked


class StopOnSigterm:
    """`with StopOnSigterm() as stop:` ... `if stop.requested:` save and leave the loop. The previous handler (the
    command line's, or Ray's: ray.init installs its own) is back on exit. Off the main thread (where Python cannot
    take signals) it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._pid = os.getpid()
        self._installed = False
        self._previous: Any = None

    def __enter__(self) -> StopOnSigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:  # None: a handler not set from Python, which cannot be put back; the default then
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        die_if_forked(signum, self._pid)
        if self.requested:
            raise Terminated(
                "stopped at once by a second SIGTERM: continue from the last checkpoint with --resume"
            )
        self.requested = True
        print(
            "\nagent-rl: SIGTERM: stopping after this step, with a checkpoint (SIGTERM again: stop at once)",
            file=sys.stderr,
            flush=True,
        )
