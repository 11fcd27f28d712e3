"""An embedded engine behind the recording gateway and `agent-rl serve`'s routes, on a loop in a background thread,
for clients that speak Anthropic's Messages API from synchronous code (the `anthropic` SDK, a harness subprocess).

    with messages_fronts(model_dir, max_seq_len=512) as f:
        url = f.open("s1")                    # ANTHROPIC_BASE_URL of gateway session s1 (the SDK adds /v1/messages)
        client = anthropic.Anthropic(base_url=url, api_key=f.key)
        ... f.session("s1").calls             # what the gateway recorded
        f.serve_url                           # serve's root (Messages at /v1/messages), same engine, same key

`thinking=True` adds a second gateway on the same engine whose tokenizer carries Qwen3's template (it renders
`reasoning_content`, so a dropped thinking block changes the prompt): `f.open(sid, thinking=True)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEY = "messages-test-key"


@dataclass
class MessagesFronts:
    loop: Any  # agent_rl.loop_thread.LoopThread
    engine: Any
    gateway: Any
    serve_url: str
    key: str
    thinking_gateway: Any = None
    opened: dict[str, Any] = field(default_factory=dict)

    def open(self, sid: str, *, thinking: bool = False, **kwargs: Any) -> str:
        """Open gateway session `sid` (kwargs: Gateway.open's) and return its Anthropic base URL."""
        gw = self.thinking_gateway if thinking else self.gateway

        async def go() -> None:
            gw.open(sid, **kwargs)

        self.loop.call(go())
        self.opened[sid] = gw
        return gw.base_url(sid).removesuffix("/v1")

    def session(self, sid: str) -> Any:
        return self.opened[sid].sessions[sid]


@contextlib.contextmanager
def messages_fronts(
    model_dir: Path,
    *,
    max_seq_len: int = 512,
    key: str = KEY,
    thinking: bool = False,
) -> Iterator[MessagesFronts]:
    from aiohttp import web
    from transformers import AutoTokenizer

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.embedded.server import build_app
    from agent_rl.gateway.server import Gateway
    from agent_rl.loop_thread import LoopThread
    from agent_rl.openai.templates import TEMPLATES

    loop = LoopThread()
    state: dict[str, Any] = {}

    async def start() -> None:
        engine = EmbeddedEngine(model_dir, EngineOptions(max_batch=8, max_seq_len=max_seq_len), seed=0)
        runner = web.AppRunner(build_app(engine, str(model_dir), served_model_name="policy", api_key=key))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        gw = Gateway(
            engine,
            AutoTokenizer.from_pretrained(model_dir),
            max_seq_len=max_seq_len,
            max_retries=0,
            api_key=key,
        )
        await gw.start()
        state.update(engine=engine, runner=runner, gw=gw, url=f"http://127.0.0.1:{runner.addresses[0][1]}")
        if thinking:
            tok = AutoTokenizer.from_pretrained(model_dir)
            tok.chat_template = TEMPLATES["qwen3"]
            tgw = Gateway(
                engine, tok, max_seq_len=max_seq_len, max_retries=0, api_key=key, reasoning_parser="qwen3"
            )
            await tgw.start()
            state["tgw"] = tgw

    async def stop() -> None:
        for name in ("tgw", "gw"):
            if name in state:
                await state[name].close()
        if "runner" in state:
            await state["runner"].cleanup()
        if "engine" in state:
            await state["engine"].close()

    try:
        loop.call(start())
        yield MessagesFronts(loop, state["engine"], state["gw"], state["url"], key, state.get("tgw"))
    finally:
        with contextlib.suppress(Exception):
            loop.call(stop(), timeout=60)
        loop.close()
