"""`agent-rl gateway`: the recording gateway in front of running engines, for agents in any process or language.

    agent-rl gateway --engines http://127.0.0.1:30000 [URL ...] --tokenizer MODEL_DIR --port 8900 [--record F.jsonl]

An agent opens a session (`POST /sessions` with sampling and budgets), points its OpenAI client at the
`base_url` it gets back, and closes the session with a reward or a final answer; the close answers the
recorded trajectories (token ids, loss mask, behaviour log-probs, versions), which `--record` also
appends to a file. Engines speak SGLang's native API (`agent-rl serve`, SGLang) or, with
`--engine-type vllm`, vLLM's. A training run serves the same routes when its env is `type: external`
(external.py), which is how `agent-rl train` trains agents it does not host.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from sandboxes.auth import add_key_args, key_from_args


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agent-rl gateway", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engines", nargs="+", required=True, metavar="URL", help="engine servers (several: a pool)"
    )
    p.add_argument(
        "--engine-type", choices=["sglang", "vllm"], default="sglang", help="their API (default sglang)"
    )
    p.add_argument(
        "--tokenizer", required=True, help="the served model's HF directory (chat template, tokenizer)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8900, help="0 picks a free port (printed on start)")
    p.add_argument("--max-seq-len", type=int, default=4096, help="the engines' context length")
    p.add_argument("--tool-parser", choices=["hermes", "qwen", "llama3_json", "none"], default="hermes")
    p.add_argument(
        "--reasoning-parser",
        choices=["qwen3", "none"],
        default="none",
        help="split <think> into reasoning_content",
    )
    add_key_args(p)
    p.add_argument(
        "--record", default=None, metavar="FILE", help="append every closed session as a JSON line"
    )
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from agent_rl.auth import check_serve_bind
    from agent_rl.engines.client import SGLangClient, VLLMClient
    from agent_rl.engines.pool import EnginePool
    from agent_rl.gateway.server import Gateway

    key = key_from_args(args)  # the gateway's, and what it sends the engines (started with the same key)
    check_serve_bind(args.host, key, insecure=args.insecure, service="agent-rl gateway")
    kind = SGLangClient if args.engine_type == "sglang" else VLLMClient
    clients = [kind(u, api_key=key) for u in args.engines]
    try:
        down = [c.url for c in clients if not await c.health()]
        if down:
            raise SystemExit(f"agent-rl gateway: engines not answering /health: {down} (start them first)")
        for (
            url
        ) in args.engines:  # /health is open: prove the key on a guarded route, or every agent's call fails
            await check_engine_key(url, args.engine_type, key)
    except SystemExit:
        for c in clients:  # closed before the one-line exit (else aiohttp warns of unclosed sessions)
            await c.close()
        raise
    engine = clients[0] if len(clients) == 1 else EnginePool(clients)
    gw = Gateway(
        engine,
        AutoTokenizer.from_pretrained(args.tokenizer),
        max_seq_len=args.max_seq_len,
        tool_parser=args.tool_parser,
        reasoning_parser=args.reasoning_parser,
        host=args.host,
        port=args.port,
        api_key=key,
    )
    gw.record_path = args.record
    url = await gw.start()
    print(f"agent-rl gateway on {url}: POST {url}/sessions opens a session", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gw.close()
    await engine.close()


GUARDED = {
    "sglang": "/get_model_info",
    "vllm": "/v1/models",
}  # a read-only route each engine guards with its key


async def check_engine_key(url: str, engine_type: str, key: str | None) -> None:
    """Exit with one line unless the engine at `url` takes `key` (or no key) on a route its key guards."""
    import aiohttp

    from sandboxes.auth import bearer

    route = GUARDED[engine_type]
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.get(url.rstrip("/") + route, headers=bearer(key)) as r,
    ):
        status = r.status
    if status in (401, 403):
        given = "the key given" if key else "no key"
        raise SystemExit(
            f"agent-rl gateway: engine {url} refused {given} on GET {route} (HTTP {status}): start the gateway "
            "with the engines' key ($AGENT_RL_API_KEY or --api-key)"
        )
    if status != 200:
        raise SystemExit(f"agent-rl gateway: engine {url}: GET {route} answered HTTP {status}; is it a {engine_type} "
                         "server (--engine-type)?")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
