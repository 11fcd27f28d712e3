"""The engine server a run starts on a node (`agent-rl serve`, bound to 127.0.0.2, a second "node" of this
machine): every request but GET /health needs the run's key, and weights load only from the run's directories."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from agent_rl.auth import WEIGHT_DIRS_ENV
from agent_rl.engines.api import BadRequest, EngineAuthFailed, EngineOptions, SamplingParams
from agent_rl.engines.client import SGLangClient
from sandboxes.auth import KEY_ENV

KEY = "engine-key-" + "e" * 32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("run")


@pytest.fixture(scope="module")
def guarded(tiny_model_dir: Path, run_dir: Path):
    """The server as a run starts it: the key and the weight dirs in its environment, on a node address."""
    from agent_rl.engines.launch import launch_server

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, KEY)
        mp.setenv(WEIGHT_DIRS_ENV, str(run_dir))
        handle = launch_server(tiny_model_dir, EngineOptions(max_batch=4, max_seq_len=128), host="127.0.0.2")
    yield handle
    handle.stop()


async def status_and_body(url: str, headers: dict[str, str], body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body or {}, headers=headers) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize("route", ["/generate", "/update_weights_from_disk", "/init_weights_update_group",
                                   "/load_lora_adapter", "/pause_generation", "/v1/chat/completions"])  # fmt: skip
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
async def test_requests_without_the_right_key_are_refused_with_401(guarded, route, headers) -> None:
    assert urlsplit(guarded.url).hostname == "127.0.0.2"
    status, body = await status_and_body(guarded.url + route, headers, {"input_ids": [1, 2]})
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body


async def test_the_key_gets_in_and_health_stays_open(guarded) -> None:
    async with aiohttp.ClientSession() as s, s.get(guarded.url + "/health") as r:
        assert r.status == 200  # launchers and probes wait on it without the key
    sp = SamplingParams(max_new_tokens=3, ignore_eos=True)
    ok = SGLangClient(guarded.url, api_key=KEY)
    wrong = SGLangClient(guarded.url, api_key="not-the-key")
    try:
        gen = await ok.generate([20, 21, 22], sp, request_id="with-key")
        assert len(gen.token_ids) == 3
        with pytest.raises(EngineAuthFailed, match="401.*wrong API key"):  # the run's key, not the request
            await wrong.generate([20, 21, 22], sp, request_id="wrong-key")
    finally:
        await ok.close()
        await wrong.close()


async def test_the_openai_client_with_a_wrong_key_gets_authentication_error(guarded, tiny_model_dir) -> None:
    import openai

    async with openai.AsyncOpenAI(base_url=guarded.url + "/v1", api_key="nope", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.completions.create(model="m", prompt="hi", max_tokens=2)
    async with openai.AsyncOpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0) as c:
        out = await c.completions.create(model=str(tiny_model_dir), prompt="hi", max_tokens=2)
        assert out.usage.completion_tokens >= 1


async def test_weights_load_from_the_run_dirs_only_and_a_path_outside_gets_403_naming_it(
    guarded, tiny_model_dir: Path, run_dir: Path
) -> None:
    inside = run_dir / "w" / "v000001"
    shutil.copytree(tiny_model_dir, inside)
    client = SGLangClient(guarded.url, api_key=KEY)
    try:
        await client.update_weights(version=1, path=str(inside))
        assert client.version == 1
        for path in (str(tiny_model_dir), "/etc", str(run_dir) + "/../" + tiny_model_dir.name):
            with pytest.raises(BadRequest, match=r"403.*outside this server's weight directories") as e:
                await client.update_weights(version=2, path=path)
            assert path in str(e.value)
        status, body = await status_and_body(
            guarded.url + "/load_lora_adapter",
            {"Authorization": f"Bearer {KEY}"},
            {"lora_name": "policy-v3", "lora_path": str(tiny_model_dir)},
        )
        assert (
            status == 403
            and body["error"]["param"] == "lora_path"
            and str(tiny_model_dir) in body["error"]["message"]
        )
    finally:
        await client.close()


def test_serve_on_a_routable_address_without_a_key_is_refused_in_one_line(
    tiny_model_dir: Path, monkeypatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    cmd = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "serve",
        str(tiny_model_dir),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("agent-rl: agent-rl serve: --host 0.0.0.0 is reachable from other machines")
    assert "--insecure" in lines[0]
