"""`agent-rl sandbox serve|build-image` (also `python -m sandboxes ...`)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from sandboxes.api import GiB, Limits
from sandboxes.auth import InsecureBind, add_key_args, check_bind, key_from_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-rl sandbox", description="Sandboxed code execution service")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="serve a sandbox pool over HTTP (SandboxFusion-compatible /run_code)"
    )
    serve.add_argument("--backend", default="local", choices=["local", "docker", "unsafe-subprocess"])
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--pool-size", type=int, default=2)
    serve.add_argument("--timeout", type=float, default=10.0, help="default wall timeout per call, seconds")
    serve.add_argument("--memory-gib", type=float, default=1.0, help="default memory limit per call")
    serve.add_argument("--docker-image", default=None, help="image for --backend docker")
    serve.add_argument("--docker-host", default=None, help="engine URL, e.g. unix:///path/docker.sock")
    serve.add_argument("--run", default="", help="value of the containers' agent-rl.run label (docker)")
    serve.add_argument("--preload", default="", help="modules the fork-servers import once, comma-separated")
    serve.add_argument("--allow-unsafe", action="store_true", help="required for --backend unsafe-subprocess")
    add_key_args(serve)
    serve.add_argument(
        "--mcp",
        action="store_true",
        help="serve an MCP tool server (a `python` tool) at /mcp instead of HTTP",
    )
    build = sub.add_parser(
        "build-image", help="build the docker sandbox image offline from this host's Python"
    )
    build.add_argument("--tag", default=None, help="image name:tag (default: the DockerOptions default)")
    build.add_argument("--docker-host", default=None)
    build.add_argument("--python", default=sys.executable)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build-image":
        from sandboxes.dockerexec import DEFAULT_IMAGE
        from sandboxes.image import build_image

        tag = build_image(args.tag or DEFAULT_IMAGE, python=args.python, docker_host=args.docker_host)
        print(f"built {tag}")
        return 0
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    import sandboxes
    from sandboxes.server import SandboxService

    key = key_from_args(args)
    try:
        check_bind(args.host, key, insecure=args.insecure, service="agent-rl sandbox serve")
    except InsecureBind as e:
        print(f"agent-rl: {e}", file=sys.stderr)
        return 2
    limits = Limits(timeout_s=args.timeout, memory_bytes=int(args.memory_gib * GiB))
    options: dict[str, object] = {}
    if args.backend == "docker":
        options = {
            k: v
            for k, v in {"image": args.docker_image, "docker_host": args.docker_host, "run": args.run}.items()
            if v
        }
    elif args.backend == "unsafe-subprocess":
        options = {"allow_unsafe": args.allow_unsafe}
    if args.preload and args.backend == "local":
        options["preload"] = args.preload.split(",")
    sandbox = sandboxes.create(args.backend, pool_size=args.pool_size, limits=limits, **options)
    if args.mcp:  # fail on a missing `mcp` before starting the pool
        from sandboxes.mcp_server import McpToolServer, plain_output

        async def run(code: str) -> str:
            return plain_output(await sandbox.run(code, limits=limits))

        mcp = McpToolServer(default=run, api_key=key)
    await sandbox.start()
    if args.mcp:
        url = await mcp.start(args.host, args.port)
        print(f"sandbox MCP server ({args.backend}, pool {args.pool_size}): {url}", flush=True)

        async def cleanup() -> None:
            await mcp.close()
            await sandbox.close()

    else:
        runner = web.AppRunner(SandboxService(sandbox, limits, api_key=key).app())
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]  # the bound port (--port 0 asks for a free one)
        print(
            f"sandbox service ({args.backend}, pool {args.pool_size}) on http://{args.host}:{port}",
            flush=True,
        )
        cleanup = runner.cleanup
    # SIGTERM and SIGINT stop the service cleanly: the pool closes, so its containers are removed.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await cleanup()  # the pool closes with the service, so its containers are removed
    print("sandbox service stopped", flush=True)
    return 0
