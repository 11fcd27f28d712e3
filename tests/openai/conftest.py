"""One embedded engine on the tool model behind the OpenAI fronts: `agent-rl serve`'s routes, the gateway, and a
second gateway that reaches the same engine through SGLang's native API with the real `SGLangClient`
(`gateway_sglang_api`): an engine that, as SGLang does, reports no unmasked log-probs for constrained calls."""

from __future__ import annotations

import contextlib

import aiohttp
import pytest


class Fronts:
    def __init__(self, engine, gateway, sglang_gateway, serve_url: str):
        self.engine, self.serve_url = engine, serve_url
        self.gateways = {"gateway": gateway, "gateway_sglang_api": sglang_gateway}
        self.gateway, self.n = gateway, 0

    def base_url(self, front: str) -> str:
        """serve's /v1, or a fresh session's base URL on the gateway `front` names."""
        if front == "serve":
            return self.serve_url + "/v1"
        self.n += 1
        self.gateway = self.gateways[front]
        self.gateway.open(f"s{self.n}")
        return self.gateway.base_url(f"s{self.n}")

    def session(self):
        return self.gateway.sessions[f"s{self.n}"]

    async def close(self, reward: float = 1.0) -> tuple[int, dict]:
        """POST /sessions/{sid}/close of the last session (as an agent in another process closes it)."""
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.gateway.url}/sessions/s{self.n}/close", json={"reward": reward}) as r,
        ):
            return r.status, await r.json()


RAISE = (
    "{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{%- endif %}{%- endfor %}"
)


@pytest.fixture(scope="session")
def strict_model(tool_model, tmp_path_factory):
    """The tool model with a template that refuses a system message after the first (as Qwen's and Mistral's do)."""
    import shutil

    from agent_rl.openai.templates import HERMES_TOOLS, set_template

    out = tmp_path_factory.mktemp("strict_model") / "m"
    shutil.copytree(tool_model, out)
    set_template(out, RAISE + HERMES_TOOLS)
    return out


@pytest.fixture(scope="session")
def two_calls_model(tiny_model_dir, tmp_path_factory):
    """The tiny model over-fitted to answer the question with two tool calls in one reply (tests/tool_model.py)."""
    import torch
    from tool_model import TWO_CALLS, build_tool_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_tool_model(
            tiny_model_dir, tmp_path_factory.mktemp("two_calls_model"), first_reply=TWO_CALLS
        )
    finally:
        torch.set_num_threads(threads)


@contextlib.asynccontextmanager
async def serve_fronts(model_dir):
    """`serve`'s routes, a gateway, and a gateway over SGLang's API, all on one embedded engine of `model_dir`."""
    from aiohttp import web
    from transformers import AutoTokenizer

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.client import SGLangClient
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.embedded.server import build_app
    from agent_rl.gateway.server import Gateway

    engine = EmbeddedEngine(model_dir, EngineOptions(max_batch=8, max_seq_len=256), seed=0)
    runner = web.AppRunner(build_app(engine, str(model_dir), served_model_name="policy"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    tok = AutoTokenizer.from_pretrained(model_dir)
    gw = Gateway(engine, tok, max_seq_len=256, max_retries=0)
    await gw.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    sglang = SGLangClient(url)
    sglang_gw = Gateway(sglang, tok, max_seq_len=256, max_retries=0)
    await sglang_gw.start()
    try:
        yield Fronts(engine, gw, sglang_gw, url)
    finally:
        await sglang_gw.close()
        await sglang.close()
        await gw.close()
        await runner.cleanup()
        await engine.close()


@pytest.fixture
async def fronts(strict_model):
    async with serve_fronts(strict_model) as f:
        yield f


@pytest.fixture
async def two_calls_fronts(two_calls_model):
    async with serve_fronts(two_calls_model) as f:
        yield f
