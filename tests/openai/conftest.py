"""One embedded engine on the tool model behind both OpenAI fronts: `agent-rl serve`'s routes and the gateway."""

from __future__ import annotations

import pytest


class Fronts:
    def __init__(self, engine, gateway, serve_url: str):
        self.engine, self.gateway, self.serve_url = engine, gateway, serve_url
        self.n = 0

    def base_url(self, front: str) -> str:
        """serve's /v1, or a fresh gateway session's base URL."""
        if front == "serve":
            return self.serve_url + "/v1"
        self.n += 1
        self.gateway.open(f"s{self.n}")
        return self.gateway.base_url(f"s{self.n}")

    def session(self):
        return self.gateway.sessions[f"s{self.n}"]


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


@pytest.fixture
async def fronts(strict_model):
    tool_model = strict_model
    from aiohttp import web
    from transformers import AutoTokenizer

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.embedded.server import build_app
    from agent_rl.gateway.server import Gateway

    engine = EmbeddedEngine(tool_model, EngineOptions(max_batch=8, max_seq_len=256), seed=0)
    runner = web.AppRunner(build_app(engine, str(tool_model), served_model_name="policy"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    gw = Gateway(engine, AutoTokenizer.from_pretrained(tool_model), max_seq_len=256, max_retries=0)
    await gw.start()
    yield Fronts(engine, gw, f"http://127.0.0.1:{runner.addresses[0][1]}")
    await gw.close()
    await runner.cleanup()
    await engine.close()
