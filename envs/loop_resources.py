"""What episodes on one event loop share and the run closes at shutdown (`close_shared_sandboxes`): sandboxes made
for envs created without one, the MCP tool server for agent episodes' sandboxes, loaded verifiers envs."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

_PER_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


def loop_resources() -> dict[str, Any]:
    """This event loop's shared resources by key; each has `async close()`."""
    return _PER_LOOP.setdefault(asyncio.get_running_loop(), {})


async def shared_mcp_server() -> Any:
    """This event loop's MCP tool server for agent episodes' sandboxes (`agent.mcp_servers`), started once."""
    per_loop = loop_resources()
    if "mcp" not in per_loop:
        from sandboxes.mcp_server import McpToolServer

        server = per_loop["mcp"] = McpToolServer()
        await server.start("127.0.0.1", 0)
    server = per_loop["mcp"]
    while server.port == 0:  # another episode is starting it
        await asyncio.sleep(0.01)
    return server


async def close_shared_sandboxes() -> None:
    """Close what episodes made for this event loop (call at shutdown)."""
    for resource in _PER_LOOP.pop(asyncio.get_running_loop(), {}).values():
        await resource.close()
