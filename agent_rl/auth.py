"""Keys by trust level, and where a run's engines may load weights from.

    with auth.run_access(run_dir):     # agent-rl train / eval: the control key in force, weight dirs, a private shm dir
        ...                            # every service the run starts requires it; every training-side client sends it

Three kinds of key, one per trust level:

- The control key (the run's key: $AGENT_RL_API_KEY when set, else a fresh random one for this run only). It
  guards everything the training side calls: the engines' routes (generate, pause, abort, weight loading, LoRA,
  the weight-update group's rendezvous), the sandbox service, the MCP tool server and the gateway's own routes
  (opening sessions). It never leaves the training side: no agent is handed it. `run_access` exports it to this
  process for the run's duration, so server processes started from here inherit it and clients built here read
  it; Ray actors that host servers on other nodes get it with their start arguments (hosts.py); SGLang gets it
  through its environment, not its command line (engines/launch.py).
- An agent token per episode: the gateway makes one when it opens a session and it opens that session's routes
  only (`/sessions/{id}/...`: chat, responses, messages, models, close); it dies with the session
  (gateway/access.py). The openai client an agent is handed carries it as its api_key.
- The external agents' key ($AGENT_RL_EXTERNAL_AGENT_KEY, required for a `type: external` env, distinct from
  the control key): it opens `POST /tasks/claim` only; a claim answers the task's session token, which closes
  that task and no other (gateway/external.py).

No key is printed: every command line, error and server log tail that reaches a message goes through
`redact` (sandboxes/auth.py), and resolved_config.json holds no key (tests/test_auth.py and
tests/security/ search the run dir and the output for it).

The run's engine servers also accept weights only from the run's own directories: the run dir (disk
publishing, LoRA adapters) and a private directory in /dev/shm that in-memory pushes go through (mode
0700, removed at the end). A path outside them gets a 403 naming the path (not the allowed roots); a path
inside is loaded as resolved, so a symlink swapped after the check cannot redirect the load
(`check_weight_path`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sandboxes.auth import KEY_ENV, InsecureBind, bearer, check_bind, env_key, redact, redact_command

__all__ = [
    "EXTERNAL_KEY_ENV", "KEY_ENV", "WEIGHT_DIRS_ENV", "bearer", "check_weight_path", "external_key", "redact",
    "redact_command", "run_access", "run_key", "server_env",
]  # fmt: skip

WEIGHT_DIRS_ENV = "AGENT_RL_WEIGHT_DIRS"  # os.pathsep-separated roots an engine server loads weights from
SHM_ENV = "AGENT_RL_SHM_DIR"  # where in-memory weight pushes are written for a server (weights/tensors.py)
SHM_ROOT = Path("/dev/shm")  # RAM; the temp dir where there is none
EXTERNAL_KEY_ENV = "AGENT_RL_EXTERNAL_AGENT_KEY"  # opens POST /tasks/claim of a run's gateway, nothing else


def run_key() -> str | None:
    """The control key in force: $AGENT_RL_API_KEY (set by `run_access` during a run), or None."""
    return env_key()


def external_key() -> str | None:
    """The external agents' key: $AGENT_RL_EXTERNAL_AGENT_KEY, or None."""
    return os.environ.get(EXTERNAL_KEY_ENV) or None


def server_env() -> dict[str, str]:
    """What a server process needs of the run (key, weight dirs), for a host on another node (hosts.py)."""
    return {k: os.environ[k] for k in (KEY_ENV, WEIGHT_DIRS_ENV) if os.environ.get(k)}


def apply_server_env(env: dict[str, str]) -> None:
    """Make `server_env()`'s answer this process's (a Ray actor hosting servers): set, or unset, each variable."""
    for k in (KEY_ENV, WEIGHT_DIRS_ENV):
        if k in env:
            os.environ[k] = env[k]
        else:
            os.environ.pop(k, None)


@contextlib.contextmanager
def run_access(run_dir: Path | None, *, external_agents: bool = False) -> Iterator[str]:
    """The run's key (yielded) and weight directories, in this process's environment until the run ends.

    `external_agents`: agents in other processes claim tasks with a key of their own, which cannot be made up
    here: then $AGENT_RL_EXTERNAL_AGENT_KEY must be set (the user gives the same value to the agents), and it
    must not be the control key (which the agents must never hold)."""
    from agent_rl.errors import UserError

    key = env_key()
    if external_agents:
        ext = external_key()
        if ext is None:
            raise UserError(
                f"the env is `type: external`: agents in other processes claim tasks with their own key, so set "
                f"${EXTERNAL_KEY_ENV} for `agent-rl train` and give the agents the same value (never "
                f"${KEY_ENV}, the run's control key)"
            )
        if ext == key:
            raise UserError(
                f"${EXTERNAL_KEY_ENV} equals ${KEY_ENV}: the external agents' key must differ from the run's "
                "control key (which pauses engines and loads weights); pick another value for one of them"
            )
    shm = Path(tempfile.mkdtemp(prefix="agent_rl_run_", dir=SHM_ROOT if SHM_ROOT.is_dir() else None))  # 0700
    dirs = [str(shm)] + ([str(Path(run_dir).resolve())] if run_dir is not None else [])
    saved = {k: os.environ.get(k) for k in (KEY_ENV, WEIGHT_DIRS_ENV, SHM_ENV)}
    os.environ[KEY_ENV] = key or secrets.token_urlsafe(32)
    os.environ[WEIGHT_DIRS_ENV] = os.pathsep.join(dirs)
    os.environ[SHM_ENV] = str(shm)
    try:
        yield os.environ[KEY_ENV]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(shm, ignore_errors=True)


def weight_dirs(flag: str | None) -> tuple[Path, ...] | None:
    """The roots a server loads weights from: --weight-dirs, else $AGENT_RL_WEIGHT_DIRS; None: anywhere."""
    value = flag if flag is not None else os.environ.get(WEIGHT_DIRS_ENV)
    if not value:
        return None
    return tuple(Path(os.path.realpath(p)) for p in value.split(os.pathsep) if p)


def check_weight_path(path: str, allowed: tuple[Path, ...] | None, field: str) -> str:
    """`path` with symlinks resolved, which the caller loads (not `path`: a link swapped after this check must
    not redirect the load); 403 (OpenAI's error body) unless it lies under one of `allowed`. The refusal names
    the path asked for, never the allowed roots (the run directory, the private shm directory)."""
    real = Path(os.path.realpath(path))
    if allowed is None or any(real == root or root in real.parents for root in allowed):
        return str(real)
    from aiohttp import web

    message = (
        f"{field} {path!r} is outside this server's weight directories (--weight-dirs, ${WEIGHT_DIRS_ENV}); "
        "it loads only from those"
    )
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": field,
            "code": "path_not_allowed",
        }
    }
    raise web.HTTPForbidden(text=json.dumps(body), content_type="application/json")


def check_serve_bind(host: str, key: str | None, *, insecure: bool, service: str) -> None:
    """`check_bind` as a one-line user error of the agent-rl command line."""
    from agent_rl.errors import UserError

    try:
        check_bind(host, key, insecure=insecure, service=service)
    except InsecureBind as e:
        raise UserError(str(e)) from None
