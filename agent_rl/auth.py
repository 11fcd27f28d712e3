"""The run's key and where its engines may load weights from.

    with auth.run_access(run_dir):     # agent-rl train / eval: the key in force, weight dirs, a private /dev/shm
        ...                            # every service the run starts requires the key; every client sends it

Every HTTP service a run starts (engine servers, the gateway, the sandbox service, the MCP tool server)
requires `Authorization: Bearer KEY` on every request but GET /health (sandboxes/auth.py, the one check
they all use), and every client the run makes sends it: the engine clients (embedded server, SGLang,
vLLM), the sandbox client, the gateway's sessions and the openai client an agent is handed (its
`api_key`). The key is $AGENT_RL_API_KEY when set, else a fresh random one for this run only. It reaches
the services the way an OpenAI key reaches its client: through the environment. `run_access` exports it
to this process for the run's duration, so server processes started from here inherit it and clients
built here read it; Ray actors that host servers on other nodes get it with their start arguments
(hosts.py). It is never logged and never written to the run directory (resolved_config.json holds no
key; tests/test_auth.py searches the run dir and the logs for it).

The run's engine servers also accept weights only from the run's own directories: the run dir (disk
publishing, LoRA adapters) and a private directory in /dev/shm that in-memory pushes go through (mode
0700, removed at the end). A path outside them gets 403 naming it (`check_weight_path`).
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

from sandboxes.auth import KEY_ENV, InsecureBind, bearer, check_bind, env_key

__all__ = ["KEY_ENV", "WEIGHT_DIRS_ENV", "bearer", "check_weight_path", "run_access", "run_key", "server_env"]

WEIGHT_DIRS_ENV = "AGENT_RL_WEIGHT_DIRS"  # os.pathsep-separated roots an engine server loads weights from
SHM_ENV = "AGENT_RL_SHM_DIR"  # where in-memory weight pushes are written for a server (weights/tensors.py)
SHM_ROOT = Path("/dev/shm")  # RAM; the temp dir where there is none


def run_key() -> str | None:
    """The key in force: $AGENT_RL_API_KEY (set by `run_access` during a run), or None."""
    return env_key()


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

    `external_agents`: agents in other processes must present the key, so it cannot be made up here: then
    $AGENT_RL_API_KEY must be set (the user gives the same value to the agents)."""
    from agent_rl.errors import UserError

    key = env_key()
    if key is None and external_agents:
        raise UserError(
            f"the env is `type: external`: agents in other processes must send the run's key, so set ${KEY_ENV} "
            "for `agent-rl train` and give the agents the same value (their OpenAI api_key)"
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


def check_weight_path(path: str, allowed: tuple[Path, ...] | None, field: str) -> None:
    """403 (OpenAI's error body) unless `path`, symlinks resolved, lies under one of `allowed`."""
    if allowed is None:
        return
    real = Path(os.path.realpath(path))
    if any(real == root or root in real.parents for root in allowed):
        return
    from aiohttp import web

    roots = ", ".join(map(str, allowed))
    message = f"{field} {path!r} is outside this server's weight directories ({roots}); it loads only those"
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
