"""Coding-agent harnesses as episode runners: Claude Code, Codex CLI, OpenCode, mini-swe-agent, or any command.

An env of `type: agent` names `envs.harness:run` as its agent, with the harness in its kwargs:

    agent:
      import_path: envs.harness:run
      kwargs: {harness: codex, prompt: "{problem}", timeout_s: 300, answer_file: answer.txt}

Each episode runs the harness as a subprocess, unmodified, in a fresh working directory with a private HOME,
pointed at the episode's gateway session by the harness's own settings (written here: Claude Code's
ANTHROPIC_BASE_URL, Codex's provider in $CODEX_HOME/config.toml, OpenCode's opencode.json, mini-swe-agent's
litellm model through OPENAI_API_BASE; `command:` instead of `harness:` runs any other program with
AGENT_RL_BASE_URL / OPENAI_BASE_URL / ANTHROPIC_BASE_URL and the session's key in its environment). Every
model call the harness makes goes through the session, which records it as token ids (agent_rl/gateway).
The harness's stdout and stderr are kept (in `log_dir`, or $AGENT_RL_HARNESS_LOGS, else beside the working
directory). The episode's answer is the harness's final message (or the file `answer_file` it wrote in its
working directory), scored by the env's `reward`. A harness that exits non-zero or outlives `timeout_s`
raises HarnessFailed with its last lines: the episode ends as an infrastructure failure (re-sampled, never
reward 0; agent_rl/gateway/episode.py).

The working directory is this machine's: the harness's own tools (its Bash, apply_patch, ...) run there as
the training process's user, with the harness's own sandboxing switched off (the harness is told so with its
bypass flags); run training with harnesses inside a container or VM. The env's `sandbox` is not used.

The commands come from `bin_dir` (default: the project's `.harnesses/`, filled by `make test-harnesses`,
scripts/install_harnesses.sh, with the pinned versions), else from PATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = ROOT / ".harnesses"  # scripts/install_harnesses.sh
MODEL = "policy"  # the name harnesses send; the gateway serves the policy under any name
TAIL = 20  # lines of a failed harness's output in the error


class HarnessFailed(RuntimeError):
    """The harness crashed, or did not finish within its time limit: an infrastructure failure, not a score."""


@dataclass(frozen=True)
class Session:
    """Where the harness reaches the model: the session's OpenAI base URL (ending in /v1) and key."""

    base_url: str
    api_key: str

    @property
    def root(self) -> str:
        """The session URL without /v1 (Anthropic clients append /v1/messages themselves)."""
        return self.base_url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class Launch:
    """One harness invocation: its argv, extra environment, and the final-message file it writes (if any)."""

    argv: list[str]
    env: dict[str, str]
    last_message: Path | None = None


@dataclass
class HarnessResult:
    returncode: int
    workdir: Path
    stdout: Path
    stderr: Path
    final: str | None  # the harness's final message
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def which(name: str, bin_dir: Path | None) -> str:
    """The harness command `name`: in bin_dir (node_modules/.bin or a venv's bin), else on PATH."""
    dirs = (
        [bin_dir] if bin_dir else [HARNESSES / "node" / "node_modules" / ".bin", HARNESSES / "venv" / "bin"]
    )
    for d in dirs:
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        raise HarnessFailed(
            f"harness command {name!r} not found in {', '.join(map(str, dirs))} or on PATH: "
            "run `make test-harnesses` (scripts/install_harnesses.sh) or install it"
        )
    return found


# -- presets: how each harness is pointed at a session -------------------------------------------
def claude_code(
    s: Session, prompt: str, workdir: Path, home: Path, bin_dir: Path | None, resume: bool = False
) -> Launch:
    env = {
        "ANTHROPIC_BASE_URL": s.root,
        "ANTHROPIC_API_KEY": s.api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "IS_SANDBOX": "1",  # it refuses to skip permissions as root otherwise; the run is the sandbox
        # its default, 32000, is more than a small model's context (a 400 naming max_tokens); the gateway's
        # per-call budget (the env's turns.max_tokens_per_turn) bounds what is sampled either way
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1024",
    }
    argv = [which("claude", bin_dir), "-p", prompt, "--model", MODEL, "--dangerously-skip-permissions"]
    return Launch(argv + (["--continue"] if resume else []), env)


def codex(
    s: Session, prompt: str, workdir: Path, home: Path, bin_dir: Path | None, resume: bool = False
) -> Launch:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "agent_rl"\n\n[model_providers.agent_rl]\n'
        f'name = "agent-rl"\nbase_url = {json.dumps(s.base_url)}\nwire_api = "responses"\n'
        'env_key = "AGENT_RL_SESSION_KEY"\n'
    )
    last = home / "codex-last-message.txt"
    argv = [
        which("codex", bin_dir),
        "exec",
        *(["resume", "--last"] if resume else []),
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-o",
        str(last),
        prompt,
    ]
    return Launch(argv, {"CODEX_HOME": str(codex_home), "AGENT_RL_SESSION_KEY": s.api_key}, last)


def opencode(
    s: Session, prompt: str, workdir: Path, home: Path, bin_dir: Path | None, resume: bool = False
) -> Launch:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": s.base_url, "apiKey": s.api_key},
        "models": {MODEL: {}},
    }
    config = {"$schema": "https://opencode.ai/config.json", "provider": {"agent_rl": provider}}
    config["model"] = f"agent_rl/{MODEL}"
    config["permission"] = {"edit": "allow", "bash": "allow", "webfetch": "deny"}
    config["agent"] = {"title": {"disable": True}}  # its side request for a session title is another chain
    (workdir / "opencode.json").write_text(json.dumps(config, indent=2))
    argv = [which("opencode", bin_dir), "run", *(["--continue"] if resume else []), prompt]
    env = {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "npm_config_offline": "true",
    }
    return Launch(argv, env)


def mini_swe_agent(
    s: Session, prompt: str, workdir: Path, home: Path, bin_dir: Path | None, resume: bool = False
) -> Launch:
    if resume:
        raise HarnessFailed("mini-swe-agent cannot continue an earlier session (it has no resume)")
    last = home / "mini-trajectory.json"
    env = {"OPENAI_API_BASE": s.base_url, "OPENAI_API_KEY": s.api_key, "MSWEA_CONFIGURED": "true"}
    env["MSWEA_COST_TRACKING"] = "ignore_errors"  # litellm has no price for a local model
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # else litellm fetches its price list from GitHub at import
    # one attempt per call: the gateway retries the engines itself, and its 4xx answers are final (mini's
    # default, 10 attempts 4-60 s apart, keeps a finished episode waiting for minutes)
    env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = "1"
    argv = [which("mini", bin_dir), "-y", "--exit-immediately", "-m", f"openai/{MODEL}", "-t", prompt]
    return Launch(argv + ["-o", str(last)], env, last)


PRESETS: dict[str, Callable[..., Launch]] = {
    "claude-code": claude_code,
    "codex": codex,
    "opencode": opencode,
    "mini-swe-agent": mini_swe_agent,
}


def command_launch(command: list[str], s: Session, prompt: str) -> Launch:
    """`command:` instead of a preset: `{prompt}` in an argument is the task's prompt; the session is in env."""
    env = {
        "AGENT_RL_BASE_URL": s.base_url,
        "AGENT_RL_API_KEY": s.api_key,
        "OPENAI_BASE_URL": s.base_url,
        "OPENAI_API_KEY": s.api_key,
        "ANTHROPIC_BASE_URL": s.root,
        "ANTHROPIC_API_KEY": s.api_key,
    }
    return Launch([a.replace("{prompt}", prompt) for a in command], env)


# -- one run ------------------------------------------------------------------------------------
async def run_harness(
    launch: Launch, workdir: Path, home: Path, log_dir: Path, timeout_s: float
) -> HarnessResult:
    """Run the harness once in `workdir` with HOME=`home`; raise HarnessFailed on a crash or past `timeout_s`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / "stdout.txt", log_dir / "stderr.txt"
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TERM", "TZ") if k in os.environ}
    env = {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1", "CI": "1"}
    env["XDG_CACHE_HOME"] = os.environ.get("AGENT_RL_HARNESS_CACHE", str(HARNESSES / "cache"))
    env.update(launch.env)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *launch.argv,
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: a timeout kills the harness and its tools
        )
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            _kill_group(proc.pid)
            await proc.wait()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise HarnessFailed(
                f"{Path(launch.argv[0]).name} ran past its {timeout_s:g} s limit (logs {log_dir}):\n"
                + _tail(out_path, err_path)
            ) from None
        finally:
            _kill_group(proc.pid)  # tools it left running in the background
    seconds = loop.time() - start
    if code != 0:
        raise HarnessFailed(
            f"{Path(launch.argv[0]).name} exited with {code} (logs {log_dir}):\n" + _tail(out_path, err_path)
        )
    final = None
    if launch.last_message is not None and launch.last_message.exists():
        final = _final(launch.last_message)
    if final is None:
        final = out_path.read_text(errors="replace").strip() or None
    return HarnessResult(code, workdir, out_path, err_path, final, seconds)


def _final(path: Path) -> str | None:
    text = path.read_text(errors="replace")
    if path.suffix != ".json":
        return text.strip() or None
    data = json.loads(text)  # mini-swe-agent's trajectory: the last assistant message
    for m in reversed(data.get("messages", [])):
        if m.get("role") == "assistant" and isinstance(m.get("content"), str):
            return m["content"].strip() or None
    return None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(*paths: Path) -> str:
    lines: list[str] = []
    for p in paths:
        lines += [f"[{p.name}] {line}" for line in p.read_text(errors="replace").splitlines()[-TAIL:]]
    return "\n".join(lines[-TAIL:]) or "(no output)"


# -- the agent entrypoint -----------------------------------------------------------------------
async def run(
    task: Any,  # envs.Task
    client: Any,  # openai.AsyncOpenAI bound to the episode's gateway session
    sandbox: Any,  # unused: the harness runs its own tools (module docstring)
    *,
    harness: str | None = None,
    command: list[str] | None = None,
    prompt: str = "{problem}",
    timeout_s: float = 600.0,
    answer_file: str | None = None,
    files: dict[str, str] | None = None,
    bin_dir: str | None = None,
    log_dir: str | None = None,
) -> str | None:
    """One episode: the harness (a preset) or `command` works on the task's prompt; its answer is returned for
    the env's reward. `files`: path -> text written into the working directory first (the task's repo)."""
    if (harness is None) == (command is None):
        raise ValueError("envs.harness: give exactly one of harness (a preset) or command (an argv list)")
    if harness is not None and harness not in PRESETS:
        raise ValueError(f"envs.harness: harness {harness!r} is not one of {sorted(PRESETS)}")
    text = prompt.replace("{problem}", task.problem).replace("{id}", str(task.id))
    session = Session(str(client.base_url).rstrip("/"), str(client.api_key))
    base = Path(tempfile.mkdtemp(prefix=f"agent-rl-{harness or 'command'}-"))
    workdir, home = base / "work", base / "home"
    workdir.mkdir()
    home.mkdir()
    for rel, content in (files or {}).items():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(content)
    # the run's choice (kwarg log_dir, or $AGENT_RL_HARNESS_LOGS), one folder per episode; else beside the workdir
    chosen = log_dir or os.environ.get("AGENT_RL_HARNESS_LOGS")
    logs = Path(chosen) / f"{task.id}-{uuid.uuid4().hex[:8]}" if chosen else base / "logs"
    bins = Path(bin_dir) if bin_dir else None
    if harness is not None:
        launch = PRESETS[harness](session, text, workdir, home, bins)
    else:
        launch = command_launch(list(command or []), session, text)
    try:
        result = await run_harness(launch, workdir, home, logs, timeout_s)
        if answer_file is not None:
            path = workdir / answer_file
            return path.read_text(errors="replace").strip() if path.exists() else None
        return result.final
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        if chosen:
            shutil.rmtree(base, ignore_errors=True)
