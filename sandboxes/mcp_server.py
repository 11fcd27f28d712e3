"""The sandbox as an MCP tool server: one `python` tool over streamable HTTP (the official `mcp` SDK).

    server = McpToolServer(default=run)      # async run(code) -> the text the model sees
    url = await server.start("127.0.0.1", 0) # http://127.0.0.1:PORT/mcp
    url = server.register("ep-17", run)      # http://127.0.0.1:PORT/episodes/ep-17/mcp: that episode's sandbox

`agent-rl sandbox serve --mcp` serves a sandbox pool at /mcp (each call a fresh sandboxed process under the
service's limits). A training run serves each agent episode's own sandbox (the env's limits, its interpreter
session) at the episode's URL, so frameworks connect as they connect to any MCP server: by URL. The MCP
protocol, sessions and transport are the SDK's; what is written here is the per-episode routing (an ASGI
wrapper that strips `/episodes/<id>` and tells the tool which sandbox to use) and running uvicorn on the
caller's event loop. Like every service the project starts, it wants `Authorization: Bearer KEY` on every
request (`api_key`, default $AGENT_RL_API_KEY: a training run's control key; sandboxes/auth.py); an episode's URL
also opens to that episode's token (`register(..., token=)`: its session token, which the agent's openai client
carries as its `api_key`), and no other episode's. `pip install 'agent-rl[mcp]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from sandboxes.api import ExecResult
from sandboxes.auth import asgi_key_check, env_key

Run = Callable[[str], Awaitable[str]]
INSTALL = "MCP tool servers need the mcp SDK: pip install 'agent-rl[mcp]' (or pip install 'mcp>=2')"
DESCRIPTION = "Run Python code in a sandbox and return what it prints."
_EPISODE = "agent_rl.episode"  # ASGI scope key: which registered sandbox a request is for


def plain_output(res: ExecResult) -> str:
    """What `sandbox serve --mcp` returns: stdout, then stderr when the code failed, and why it stopped."""
    out = res.stdout
    if res.exit_code != 0 or res.timed_out or res.oom_killed:
        out += res.stderr
        if res.timed_out:
            out += "\n[timed out]"
        elif res.oom_killed:
            out += "\n[killed: out of memory]"
    return out


class McpToolServer:
    def __init__(
        self, default: Run | None = None, *, name: str = "agent-rl-sandbox", api_key: str | None = None
    ):
        try:
            from mcp.server.mcpserver import Context, MCPServer
            from mcp.server.mcpserver.exceptions import ToolError
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(INSTALL, name="mcp") from e
        self.default = default
        self.api_key = api_key or env_key()  # None: no key asked (loopback only, see sandboxes/cli.py)
        self.host, self.port = "127.0.0.1", 0
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self.mcp = MCPServer(name, log_level="WARNING")

        async def python(code: str, ctx: Context) -> str:
            episode = ctx.request_context.request.scope.get(_EPISODE)
            run = self.runs.get(episode) if episode is not None else self.default
            if run is None:
                raise ToolError(f"no sandbox for episode {episode!r} (it ended, or this URL is wrong)")
            return await run(code)

        python.__annotations__ = {"code": str, "ctx": Context, "return": str}  # real types, not strings
        self.mcp.add_tool(python, name="python", description=DESCRIPTION, structured_output=False)
        self.runs: dict[str, Run] = {}
        self._tokens: dict[str, bytes] = {}  # episode -> SHA-256 of its token

    def url(self, episode: str | None = None) -> str:
        prefix = f"/episodes/{episode}" if episode is not None else ""
        return f"http://{self.host}:{self.port}{prefix}/mcp"

    def register(self, episode: str, run: Run, token: str | None = None) -> str:
        """Serve `run` as the `python` tool at this episode's URL (returned); `token` (the episode's session token,
        which its agent's OpenAI client carries) opens that URL besides the server's key, and no other."""
        self.runs[episode] = run
        if token:
            self._tokens[episode] = hashlib.sha256(token.encode()).digest()
        return self.url(episode)

    def unregister(self, episode: str) -> None:
        self.runs.pop(episode, None)
        self._tokens.pop(episode, None)

    def _episode_token(self, path: str, presented: str) -> bool:
        """Whether `presented` is the token registered for the episode whose URL `path` is."""
        if not path.startswith("/episodes/"):
            return False
        want = self._tokens.get(path[len("/episodes/") :].partition("/")[0])
        got = hashlib.sha256(presented.encode()).digest()
        return want is not None and secrets.compare_digest(got, want)

    def app(self, host: str = "127.0.0.1") -> Any:
        """The ASGI app for a server bound to `host` (the SDK's Host-header check allows only 127.0.0.1, localhost
        and ::1 for those, and none for another address: the key is what keeps strangers out there)."""
        inner = self.mcp.streamable_http_app(stateless_http=True, json_response=True, host=host)

        async def route(scope: dict, receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith("/episodes/"):
                episode, _, rest = path[len("/episodes/") :].partition("/")
                scope = {**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode(), _EPISODE: episode}
            await inner(scope, receive, send)

        return asgi_key_check(route, self.api_key, also=self._episode_token)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on the running event loop (uvicorn, no signal handlers of its own); the /mcp URL."""
        import uvicorn

        class Server(uvicorn.Server):
            def capture_signals(self) -> Any:  # the caller owns SIGINT/SIGTERM
                return contextlib.nullcontext()

        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # a taken port raises EADDRINUSE here, not inside uvicorn
        config = uvicorn.Config(self.app(host), log_level="warning", lifespan="on")
        self._server = Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"the MCP server on {host}:{port} stopped while starting")
            await asyncio.sleep(0.02)
        self.host, self.port = host, sock.getsockname()[1]
        return self.url()

    async def close(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
            self._server = self._task = None
