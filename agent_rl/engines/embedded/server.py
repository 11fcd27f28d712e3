"""HTTP server for the embedded engine: SGLang's native API plus OpenAI-compatible routes (openai_api.py).

    python -m agent_rl.engines.embedded.server MODEL_DIR --port 30000      (or `agent-rl serve MODEL_DIR`)

SGLang-native routes, same field names and response shapes as SGLang: POST /generate,
/abort_request, /pause_generation, /continue_generation, /update_weights_from_disk;
GET /get_model_info, /get_weight_version, /get_load, /health; the distributed weight update
(/init_weights_update_group, /update_weights_from_distributed, ...) is in broadcast_routes.py.
One extension: /generate's meta_info carries `output_token_versions`, the weight version of
every output token (SGLang reports one `weight_version` per response). A scoring request (SGLang's
form: `max_new_tokens: 0`, `return_logprob`, `logprob_start_len: L`) samples nothing and answers
`input_token_logprobs` for tokens L.. as SGLang does: `[logprob, id, text]`, the first entry's
log-prob None; a distillation teacher's call (agent_rl/teacher). Bad requests get a 4xx JSON {"error": {"message": ...}}; a client
that disconnects has its request aborted and its slot freed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import uuid
from pathlib import Path

from aiohttp import web

from agent_rl import auth
from agent_rl.engines import routed_experts
from agent_rl.engines.api import EngineOptions
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.lora_routes import check_lora_path
from agent_rl.engines.embedded.scheduler import Output
from agent_rl.engines.embedded.web import ENGINE, MODEL_PATH, WEIGHT_DIRS, tokenizer, trim_stop
from agent_rl.engines.protocol import AbortReq, ContinueReq, GenerateReq, PauseReq, UpdateFromDiskReq
from agent_rl.openai import anthropic_reply
from agent_rl.openai.errors import Invalid, errors_to_json, parse
from sandboxes.auth import add_key_args, aiohttp_key_check, key_from_args

log = logging.getLogger(__name__)


def finish_reason(out: Output) -> dict:
    g = out.generation
    if g.finish_reason == "stop":
        return {"type": "stop", "matched": out.matched}
    if g.finish_reason == "length":
        return {"type": "length", "length": len(g.token_ids)}
    return {"type": "abort", "message": "aborted (pause_generation, abort_request or client disconnect)"}


async def generate(request: web.Request) -> web.Response:
    """SGLang /generate: one prompt, or a batch (text or input_ids as a list), each sampled n times."""
    req = await parse(request, GenerateReq)
    engine = request.app[ENGINE]
    check_lora_path(req.lora_path, engine.adapter_name)
    base = req.rid or uuid.uuid4().hex
    jobs = []
    for p, prompt in enumerate(req.prompts()):
        ids = prompt if isinstance(prompt, list) else tokenizer(request)(prompt)["input_ids"]
        if req.sampling_params.max_new_tokens == 0:  # scoring (protocol.GenerateReq allows it only so)
            jobs.append(_score(req, engine, ids, base if not req.batched else f"{base}-{p}"))
            continue
        for i in range(req.sampling_params.n):
            rid = (
                base if not req.batched else f"{base}-{p}-{i}" if req.sampling_params.n > 1 else f"{base}-{p}"
            )
            params = req.sampling_params.to_params(i)
            if req.return_routed_experts:
                params = dataclasses.replace(params, return_routed_experts=True)
            jobs.append(
                engine.generate_full(
                    ids,
                    params,
                    request_id=rid,
                    top_logprobs=req.top_logprobs_num if req.return_logprob else 0,
                )
            )
    outs = await asyncio.gather(*jobs)
    results = [out if isinstance(out, dict) else _generate_result(req, engine, out) for out in outs]
    return web.json_response(results if req.batched else results[0])


async def _score(req: GenerateReq, engine: EmbeddedEngine, ids: list[int], rid: str) -> dict:
    """SGLang's answer to max_new_tokens=0 with logprob_start_len L: input_token_logprobs pairs token L+i with
    its log-prob given the tokens before it (i >= 1); entry 0 carries None, as SGLang's does."""
    start = req.logprob_start_len
    if start >= len(ids):
        raise Invalid(
            f"logprob_start_len={start} must be < the {len(ids)} input ids", param="logprob_start_len"
        )
    scores = await engine.score(ids, start=start + 1, request_id=rid) if start + 1 < len(ids) else []
    tok = engine.scheduler.tokenizer if req.return_text_in_logprobs else None
    entries = [
        [lp, t, None if tok is None else tok.decode([t])]
        for lp, t in zip([None, *scores], ids[start:], strict=True)
    ]
    meta = {
        "id": rid,
        "finish_reason": {"type": "length", "length": 0},
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "weight_version": str(engine.version),
        "input_token_logprobs": entries,
        "output_token_logprobs": [],
    }
    return {"text": "", "output_ids": [], "meta_info": meta}


def _generate_result(req: GenerateReq, engine: EmbeddedEngine, out: Output) -> dict:
    g, sp = out.generation, req.sampling_params
    tok = engine.scheduler.tokenizer
    text = "" if tok is None else tok.decode(g.token_ids, skip_special_tokens=sp.skip_special_tokens)
    meta = {
        "id": out.rid,
        "finish_reason": finish_reason(out),
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(g.token_ids),
        "cached_tokens": out.cached_tokens,
        "weight_version": str(g.versions[-1] if g.versions else engine.version),
        "e2e_latency": out.latency_s,
        "output_token_versions": g.versions,
    }
    if req.return_logprob:

        def piece(t: int) -> str | None:
            return tok.decode([t]) if req.return_text_in_logprobs and tok else None

        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [
            [lp, t, piece(t)] for lp, t in zip(g.logprobs, g.token_ids, strict=True)
        ]
        if req.top_logprobs_num:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [
                [[lp, t, piece(t)] for t, lp in top] for top in (out.top_logprobs or [])
            ]
    if g.routed_experts is not None:
        meta |= routed_experts.to_meta(g.routed_experts)
    return {"text": trim_stop(text, out, sp.no_stop_trim), "output_ids": g.token_ids, "meta_info": meta}


async def abort_request(request: web.Request) -> web.Response:
    req = await parse(request, AbortReq)
    if not req.abort_all and not req.rid:
        raise Invalid("give rid, or abort_all=true")
    n = await request.app[ENGINE].abort(None if req.abort_all else req.rid)
    return web.json_response({"success": True, "num_aborted": n})


async def pause_generation(request: web.Request) -> web.Response:
    await parse(request, PauseReq)
    await request.app[ENGINE].pause()
    return web.json_response({"success": True, "message": "paused; in-flight requests aborted"})


async def continue_generation(request: web.Request) -> web.Response:
    await parse(request, ContinueReq)
    await request.app[ENGINE].resume()
    return web.json_response({"success": True, "message": "resumed"})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    req = await parse(request, UpdateFromDiskReq)
    engine = request.app[ENGINE]
    # the resolved path is what loads: a symlink swapped after the check cannot redirect the load
    real = auth.check_weight_path(req.model_path, request.app[WEIGHT_DIRS], "model_path")
    if not Path(real).exists():
        raise Invalid(f"model_path {req.model_path!r} does not exist on the server's machine")
    try:
        version = engine.version if req.weight_version is None else int(req.weight_version)
    except ValueError:
        raise Invalid(f"weight_version must be an integer string, got {req.weight_version!r}") from None
    aborted = await engine.abort() if req.abort_all_requests else 0
    await engine.update_weights(version=version, path=real)  # no safetensors, or a corrupt one: a 400
    return web.json_response(
        {
            "success": True,
            "message": f"loaded {req.model_path} as version {version}",
            "num_paused_requests": aborted,
        }
    )


async def get_model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    cfg = engine.scheduler.model.cfg
    return web.json_response(
        {
            "model_path": request.app[MODEL_PATH],
            "tokenizer_path": request.app[MODEL_PATH],
            "is_generation": True,
            "weight_version": str(engine.version),
            "max_seq_len": engine.scheduler.max_seq_len,
            "max_batch": engine.scheduler.max_batch,
            "vocab_size": cfg.vocab_size,
            "eos_token_ids": list(cfg.eos_token_ids),
        }
    )


async def get_weight_version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": str(request.app[ENGINE].version)})


async def get_load(request: web.Request) -> web.Response:
    sched = request.app[ENGINE].scheduler
    return web.json_response({"num_running_reqs": len(sched.running), "num_waiting_reqs": len(sched.waiting)})


async def health(request: web.Request) -> web.Response:
    ok = await request.app[ENGINE].health()
    return web.Response(text="OK" if ok else "engine thread is not running", status=200 if ok else 503)


def build_app(
    engine: EmbeddedEngine,
    model_path: str,
    *,
    served_model_name: str | None = None,
    tool_parser: str = "hermes",
    reasoning_parser: str | None = None,
    api_key: str | None = None,
    weight_dirs: tuple[Path, ...] | None = None,
) -> web.Application:
    """served_model_name: the OpenAI model id (default: model_path); tool_parser: tool_parsers.PARSERS key;
    reasoning_parser: reasoning.REASONING_PARSERS key (None: no reasoning_content); api_key: required of every
    request but GET /health (agent_rl/auth.py); weight_dirs: the only roots weights and adapters load from."""
    from agent_rl.engines.embedded.lora_routes import add_lora_routes
    from agent_rl.engines.embedded.openai_routes import (
        REASONING_PARSER,
        SERVED_NAME,
        TOOL_PARSER,
        add_openai_routes,
    )
    from agent_rl.engines.embedded.weight_routes import add_weight_group_routes
    from agent_rl.openai.reasoning import get_reasoning_parser
    from agent_rl.openai.tool_parsers import get_parser

    get_parser(tool_parser)  # an unknown name fails at start, not at the first request
    get_reasoning_parser(reasoning_parser)
    app = web.Application(
        middlewares=[anthropic_reply.compat, aiohttp_key_check(api_key), errors_to_json],
        client_max_size=64 * 1024**2,
    )
    app[ENGINE], app[MODEL_PATH], app[WEIGHT_DIRS] = engine, model_path, weight_dirs
    app[SERVED_NAME], app[TOOL_PARSER] = served_model_name or model_path, tool_parser
    if reasoning_parser is not None:
        app[REASONING_PARSER] = reasoning_parser
    app.router.add_post("/generate", generate)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/get_weight_version", get_weight_version)
    app.router.add_get("/get_load", get_load)
    app.router.add_get("/health", health)
    add_weight_group_routes(app)
    add_lora_routes(app)
    add_openai_routes(app)
    return app


async def serve(args: argparse.Namespace) -> None:
    key = key_from_args(args)
    auth.check_serve_bind(args.host, key, insecure=args.insecure, service="agent-rl serve")
    engine = EmbeddedEngine(
        args.model_dir,
        EngineOptions(
            args.max_batch, args.max_seq_len, args.dtype, args.lm_head_fp32, not args.no_copy_prefixes
        ),
        seed=args.seed,
    )
    app = build_app(
        engine,
        str(args.model_dir),
        served_model_name=args.served_model_name,
        tool_parser=args.tool_parser,
        reasoning_parser=args.reasoning_parser,
        api_key=key,
        weight_dirs=auth.weight_dirs(args.weight_dirs),
    )
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    # launch.py waits for this exact line to learn the port when --port 0 was asked for.
    print(f"agent-rl engine serving {args.model_dir} on http://{args.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.exit_with_parent:
        watch = asyncio.create_task(_exit_when_orphaned(stop))
    await stop.wait()
    if args.exit_with_parent:
        watch.cancel()
    await runner.cleanup()
    await engine.close()


async def _exit_when_orphaned(stop: asyncio.Event, interval_s: float = 1.0) -> None:
    """Stop when the process that started us is gone (re-parented), e.g. a trainer killed with SIGKILL: an
    orphaned engine would keep decoding its last requests and hold a core."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(interval_s)
    log.warning("parent process %d is gone; stopping", parent)
    stop.set()


def parse_args(argv: list[str]) -> argparse.Namespace:
    from agent_rl.openai.reasoning import REASONING_PARSERS
    from agent_rl.openai.tool_parsers import PARSERS

    p = argparse.ArgumentParser(
        prog="agent-rl serve", description="Serve a HF causal LM with the embedded CPU engine."
    )
    p.add_argument("model_dir", type=Path, help="Hugging Face model directory (config.json + *.safetensors)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on start)")
    default = EngineOptions()
    p.add_argument(
        "--max-batch", type=int, default=default.max_batch, help="concurrent sequences (KV-cache slots)"
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=default.max_seq_len,
        help="context length per sequence (prompt + output)",
    )
    p.add_argument("--dtype", default=default.dtype, choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--lm-head-fp32",
        action="store_true",
        help="the final norm's output and the LM head's matmul in fp32 (a bf16 model; model.lm_head_fp32)",
    )
    p.add_argument(
        "--no-copy-prefixes",
        action="store_true",
        help="prefill every prompt whole, never copying a running request's prompt keys (engines.copy_prefixes)",
    )
    p.add_argument("--served-model-name", default=None, help="OpenAI model id (default: MODEL_DIR as given)")
    p.add_argument(
        "--tool-parser",
        default="hermes",
        choices=sorted(PARSERS),
        help="how chat completions with `tools` find tool calls in the output (hermes/qwen: "
        '<tool_call>{json}</tool_call>; llama3_json: {"name": ..., "parameters": ...})',
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="split the output's reasoning into `reasoning_content` (qwen3: <think>...</think>); default: none",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the sampling stream for requests without a seed"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default; 1 is steadiest on a busy CPU)",
    )
    p.add_argument(
        "--cores",
        type=lambda v: tuple(int(c) for c in v.split(",")),
        default=None,
        help="pin the server to these CPU cores, e.g. 0 or 0,1 (sets the torch threads to their count)",
    )
    add_key_args(p)
    p.add_argument(
        "--weight-dirs",
        default=None,
        metavar="DIR[:DIR]",
        help="load weights and adapters only from under these directories (403 otherwise; default: "
        f"${auth.WEIGHT_DIRS_ENV}, which a training run sets to its own; unset: anywhere)",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started the server exits (the trainer's engine servers)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not (args.model_dir / "config.json").is_file():
        print(
            f"agent-rl serve: {args.model_dir}/config.json not found; MODEL_DIR must be a HF model dir",
            file=sys.stderr,
        )
        return 2
    if args.cores:
        from agent_rl.cores import pin

        pin(args.cores)
    elif args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
