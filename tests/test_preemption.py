"""SIGTERM at the command line's boundary (`errors.run`) and in the training loop (`preemption.StopOnSigterm`):
signals sent to this process itself, so the handlers under test are the real ones (tests/loop/test_sigterm.py
sends them to a real `agent-rl train`)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from agent_rl import errors
from agent_rl.preemption import StopOnSigterm

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next bytecode of this thread


def test_a_command_stopped_by_sigterm_unwinds_prints_one_line_and_exits_143(capsys) -> None:
    unwound = []

    def command() -> int:
        try:
            _sigterm_self()
            return 0
        finally:
            unwound.append(True)

    before = signal.getsignal(signal.SIGTERM)
    assert errors.run(command) == errors.EXIT_TERMINATED == 143
    assert unwound == [True]
    assert capsys.readouterr().err.splitlines() == ["agent-rl: terminated (SIGTERM)"]
    assert signal.getsignal(signal.SIGTERM) is before, "errors.run left its SIGTERM handler installed"


def test_the_first_sigterm_in_the_loop_asks_for_a_stop_and_the_second_stops_at_once(capsys) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSigterm() as stop:
        assert not stop.requested
        _sigterm_self()
        assert stop.requested  # nothing raised: the step in progress goes on
        assert "stopping after this step, with a checkpoint" in capsys.readouterr().err
        with pytest.raises(errors.Terminated, match="second SIGTERM"):
            _sigterm_self()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_loops_handler_replaces_the_command_lines_and_gives_it_back(capsys) -> None:
    seen = []

    def command() -> int:
        with StopOnSigterm() as stop:
            _sigterm_self()
            seen.append(stop.requested)
        _sigterm_self()  # the loop is over (shutdown): errors.run's handler again, which unwinds at once
        seen.append("not reached")
        return 0

    assert errors.run(command) == errors.EXIT_TERMINATED
    assert seen == [True]
    assert capsys.readouterr().err.splitlines()[-1] == "agent-rl: terminated (SIGTERM)"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_child_forked_with_the_handler_dies_of_sigterm_instead_of_running_it() -> None:
    with StopOnSigterm():
        pid = os.fork()
        if pid == 0:  # the child: SIGTERM must end it as the default action would, not ask its loop to stop
            try:
                _sigterm_self()
            finally:
                os._exit(0)  # reached only if the handler let the child live
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, f"child exit status {status:#x}"
