"""Status codes that blame the right side, one test per case: the run's misconfiguration (an engine that refuses
the gateway's key) is a 502 to the agent that names no upstream and spends none of its budget, and stops
`agent-rl gateway` at start; a client's mistake is a 4xx with a one-line message, never a 500 or a traceback. The
services are the real ones, served in this process (engine server with the tiny model, the sandbox service)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent_rl.engines.api import EngineOptions
from sandboxes.auth import KEY_ENV

CONTROL = "control-key-" + "c" * 32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    from agent_rl.engines.embedded.engine import EmbeddedEngine

    e = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=2, max_seq_len=128), seed=0)
    yield e
    asyncio.run(e.close())


@pytest.fixture
async def engine_server(engine, tiny_model_dir: Path, tmp_path: Path):
    """The engine server as a run starts it (the control key, the run dir as its one weight directory)."""
    from agent_rl.engines.embedded.server import build_app

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    app = build_app(engine, str(tiny_model_dir), api_key=CONTROL, weight_dirs=(run_dir.resolve(),))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", run_dir
    await runner.cleanup()


async def _post(url: str, body: dict, key: str | None = CONTROL) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


def _one_line_4xx(status: int, body: dict, *words: str) -> None:
    message = body["error"]["message"]
    assert 400 <= status < 500 and "\n" not in message and "Traceback" not in message, (status, body)
    for w in words:
        assert w in message, (w, message)


async def test_an_engine_refusing_the_gateways_key_is_a_502_naming_no_upstream_and_spending_no_budget(
    engine_server, tool_model: Path
) -> None:
    import openai
    from transformers import AutoTokenizer

    from agent_rl.engines.client import SGLangClient
    from agent_rl.gateway.record import SessionLimits
    from agent_rl.gateway.server import Gateway

    url, _ = engine_server
    client = SGLangClient(url, api_key="not-the-engines-key")
    gw = Gateway(client, AutoTokenizer.from_pretrained(tool_model), max_seq_len=128, api_key=CONTROL)
    session = gw.open("s", limits=SessionLimits(max_calls=1))
    agent = gw.client("s")
    try:
        for _ in range(2):  # a spent budget would make the second a 409
            with pytest.raises(openai.APIStatusError) as e:
                await agent.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
            assert e.value.status_code == 502, e.value
            message = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value.body)
            assert "refused its key" in message and "http://" not in message and url not in message
        assert session.stats.calls == 0 and session.over is None  # no budget spent
        assert session.stats.errors and url in session.stats.errors[-1]  # the run's record keeps the cause
        assert gw.engine_retries == 0  # a refused key is not retried
    finally:
        await agent.close()
        await gw.close()
        await client.close()


async def test_agent_rl_gateway_with_a_key_the_engine_refuses_stops_at_start_in_one_line(
    engine_server, tool_model: Path
) -> None:
    """Its start check proves the key on a guarded route (GET /get_model_info), not on the open /health."""
    url, _ = engine_server
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV} | {"PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent_rl.cli", "gateway", "--engines", url, "--tokenizer", str(tool_model),
        "--port", "0", "--api-key", "wrong-key", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert proc.returncode != 0 and not out, (out, err)
    assert len(lines) == 1 and "refused the key given on GET /get_model_info (HTTP 401)" in lines[0], lines
    assert "wrong-key" not in lines[0]


async def test_scoring_from_at_or_past_the_end_of_the_input_is_a_400(engine_server) -> None:
    url, _ = engine_server
    for start in (3, 7):
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                "logprob_start_len": start}  # fmt: skip
        status, answer = await _post(url + "/generate", body)
        _one_line_4xx(status, answer, f"logprob_start_len={start}", "3 input ids")
        assert status == 400 and answer["error"]["param"] == "logprob_start_len"


async def test_loading_weights_from_a_folder_without_safetensors_or_with_a_corrupt_one_is_a_400(
    engine_server,
) -> None:
    url, run_dir = engine_server
    empty = run_dir / "empty"
    empty.mkdir()
    status, body = await _post(url + "/update_weights_from_disk", {"model_path": str(empty)})
    _one_line_4xx(status, body, "no *.safetensors")
    corrupt = run_dir / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    status, body = await _post(url + "/update_weights_from_disk", {"model_path": str(corrupt)})
    _one_line_4xx(status, body, "not a readable safetensors file")


async def test_loading_a_lora_from_a_folder_that_is_not_an_adapter_is_a_400(
    engine_server, tiny_model_dir: Path
) -> None:
    url, run_dir = engine_server
    model = run_dir / "model"
    shutil.copytree(tiny_model_dir, model)  # a model directory, not an adapter
    status, body = await _post(url + "/load_lora_adapter", {"lora_name": "a", "lora_path": str(model)})
    _one_line_4xx(status, body, "not a PEFT adapter directory")
    broken = run_dir / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    (broken / "adapter_model.safetensors").write_bytes(b"junk")
    status, body = await _post(url + "/load_lora_adapter", {"lora_name": "a", "lora_path": str(broken)})
    _one_line_4xx(status, body, "not a LoRA adapter config")


async def test_weights_load_from_the_resolved_path_that_was_checked(
    engine_server, engine, tiny_model_dir
) -> None:
    """A link inside the weight dirs is loaded through its target as resolved at the check, so swapping the link
    afterwards cannot redirect the load outside them (the engine is handed the resolved path)."""
    url, run_dir = engine_server
    real = run_dir / "w" / "v1"
    shutil.copytree(tiny_model_dir, real)
    (run_dir / "latest").symlink_to(real)
    given: list[str] = []
    load = engine.update_weights

    async def spy(**kw):  # records what the server hands the real engine
        given.append(kw["path"])
        return await load(**kw)

    engine.update_weights = spy
    try:
        status, body = await _post(url + "/update_weights_from_disk", {"model_path": str(run_dir / "latest")})
    finally:
        del engine.update_weights
    assert status == 200, body
    assert given == [str(real.resolve())]


async def test_a_refused_weight_path_names_neither_the_run_dir_nor_the_private_shm_dir(engine_server) -> None:
    url, run_dir = engine_server
    status, body = await _post(url + "/update_weights_from_disk", {"model_path": "/etc"})
    message = body["error"]["message"]
    assert status == 403 and "'/etc'" in message
    assert str(run_dir) not in message and str(run_dir.resolve()) not in message and "/dev/shm" not in message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"code": "print(1)", "run_timeout": 1e300}, "run_timeout"),
        ({"code": "print(1)", "run_timeout": float("inf")}, "run_timeout"),
        ({"code": "print(1)", "memory_limit_MB": 1e300}, "memory_limit_MB"),
        ({"code": "print(1)", "limits": {"timeout_s": 1e300}}, "limits"),
    ],
)
async def test_the_sandbox_service_answers_an_impossible_limit_with_a_400(body: dict, field: str) -> None:
    import sandboxes
    from sandboxes.server import SandboxService

    sandbox = sandboxes.create("local", pool_size=1)  # a refused request never reaches it
    app = SandboxService(sandbox, api_key=CONTROL).app()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    route = "/v1/run" if "limits" in body else "/run_code"
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}{route}"
        headers = {"Authorization": f"Bearer {CONTROL}", "Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=json.dumps(body), headers=headers) as r,
        ):
            status, answer = r.status, await r.json()
    finally:
        await runner.cleanup()
    assert status == 400 and field in answer["message"] and "\n" not in answer["message"], answer


def test_sandbox_serve_on_port_0_prints_the_port_it_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import subprocess

    monkeypatch.setenv(KEY_ENV, CONTROL)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxes", "serve", "--host", "127.0.0.1", "--port", "0", "--pool-size", "1"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        assert port != 0, line
        with socket.create_connection(("127.0.0.1", port), timeout=30):
            pass  # the printed port is the one it listens on
    finally:
        proc.terminate()
        proc.wait(60)
