"""Start the embedded engine's HTTP server in a subprocess and hand back its URL and a client.

The server runs in its own process so its torch threads and the engine's GIL time stay out of
the trainer's process. Its stdout/stderr go to a log file whose path errors quote. No command line carries
a key (SGLang's reaches it through its environment: sglang_launch.py), and every command and log tail an
error quotes goes through `auth.redact` first.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rl import auth
from agent_rl.engines.api import EngineOptions
from agent_rl.engines.client import SGLangClient

READY = re.compile(r"agent-rl engine serving .* on (http://\S+)")


@dataclass
class EmbeddedServerHandle:
    url: str
    process: subprocess.Popen
    log_path: Path

    def client(self, **kw) -> SGLangClient:
        return SGLangClient(self.url, **kw)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EmbeddedServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch_server(
    model_dir: str | Path,
    opts: EngineOptions = EngineOptions(),
    *,
    port: int = 0,
    seed: int = 0,
    threads: int = 0,
    cores: tuple[int, ...] | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 180.0,
    log_path: str | Path | None = None,
) -> EmbeddedServerHandle:
    cmd = [
        sys.executable, "-m", "agent_rl.engines.embedded.server", str(model_dir),
        "--host", host, "--port", str(port), "--max-batch", str(opts.max_batch),
        "--max-seq-len", str(opts.max_seq_len), "--dtype", opts.dtype, "--seed", str(seed), "--threads", str(threads),
        "--exit-with-parent",
    ]  # fmt: skip
    if cores:
        cmd += ["--cores", ",".join(map(str, cores))]
    if opts.lm_head_fp32:
        cmd += ["--lm-head-fp32"]
    if not opts.copy_prefixes:
        cmd += ["--no-copy-prefixes"]
    return start_server(
        cmd, lambda text: m.group(1) if (m := READY.search(text)) else None, timeout_s, log_path
    )


def start_server(
    cmd: list[str], url_of: Any, timeout_s: float, log_path: str | Path | None = None, env: dict | None = None
) -> EmbeddedServerHandle:
    """Run `cmd` with its output in a log file; wait until `url_of(log text)` names a URL whose /health answers."""
    log = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="agent_rl_server_", suffix=".log")[1])
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                auth.redact(
                    f"server exited with code {proc.returncode} before serving ({' '.join(cmd[:4])} ...); "
                    f"log {log}:\n{_tail(log)}"
                )
            )
        if url is None:
            url = url_of(log.read_text(errors="replace"))
        if url is not None and _healthy(url):
            return EmbeddedServerHandle(url=url, process=proc, log_path=log)
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError(
        auth.redact(
            f"server not healthy after {timeout_s:.0f} s ({auth.redact_command(cmd)}); log {log}:\n{_tail(log)}"
        )
    )


def launch_sglang(
    model_dir: str,
    *,
    host: str,
    tp: int,
    max_seq_len: int,
    dtype: str,
    seed: int,
    extra: tuple[str, ...] = (),
    timeout_s: float = 1800.0,
) -> EmbeddedServerHandle:
    """`python -m sglang.launch_server` on this node's GPUs (CUDA_VISIBLE_DEVICES as Ray set it), on a free port,
    through sglang_launch.py, which hands it the run's key ($AGENT_RL_API_KEY) off the command line."""
    port = free_port(host)
    cmd = [
        sys.executable, "-m", "agent_rl.engines.sglang_launch", "--model-path", model_dir, "--host", host,
        "--port", str(port), "--tp", str(tp), "--dtype", dtype, "--context-length", str(max_seq_len),
        "--random-seed", str(seed), "--mem-fraction-static", "0.8", *extra,
    ]  # fmt: skip
    url = f"http://{host}:{port}"
    return start_server(cmd, lambda _text: url, timeout_s)


def sandbox_command(host: str, port: int, kw: dict[str, Any]) -> list[str]:
    """`agent-rl sandbox serve` for an env's sandbox section (backend and options) on host:port."""
    cmd = [sys.executable, "-m", "sandboxes", "serve", "--host", host, "--port", str(port)]
    cmd += ["--backend", kw["backend"], "--pool-size", str(kw.get("pool_size", 2))]
    if kw.get("preload"):
        cmd += ["--preload", ",".join(kw["preload"])]
    for opt in ("image", "docker_host"):
        if kw.get(opt):
            cmd += [f"--docker-{opt.removeprefix('docker_').replace('_', '-')}", str(kw[opt])]
    return cmd


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:]


def launch_embedded(
    model_dir: str,
    opts: EngineOptions = EngineOptions(),
    *,
    port: int = 0,
    seed: int = 0,
    threads: int = 0,
    cores: tuple[int, ...] | None = None,
) -> EmbeddedServerHandle:
    """Start `python -m agent_rl.engines.embedded.server MODEL_DIR ...` in a subprocess and wait until /health answers.

    threads: torch CPU threads of the server process (0 = torch's default); cores: pin it to these cores.
    """
    return launch_server(
        model_dir,
        opts,
        port=port,
        seed=seed,
        threads=threads,
        cores=cores,
    )
