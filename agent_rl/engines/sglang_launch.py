"""`python -m agent_rl.engines.sglang_launch ARGS...`: SGLang's `sglang.launch_server ARGS... --api-key KEY`, with the
key read from this process's environment ($AGENT_RL_API_KEY) instead of its command line.

SGLang takes its key from the command line only, and a command line is readable by every user of the machine
(`ps`, /proc/PID/cmdline) and lands in whatever prints it. This shim adds `--api-key` to `sys.argv` inside the
process, where /proc shows the original arguments, and runs SGLang's own entry point (`runpy`, as `python -m`
does); SGLang's workers start by multiprocessing, which passes arguments through a pipe, not a command line.
"""

from __future__ import annotations

import runpy
import sys

from sandboxes.auth import env_key


def main() -> None:
    key = env_key()
    sys.argv = [sys.argv[0], *sys.argv[1:], *(["--api-key", key] if key else [])]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
