"""An agent whose tools come from MCP servers: it lists their tools, offers them to the model as OpenAI
function tools, and calls them through the MCP client (the official `mcp` SDK, streamable HTTP).

The env hands it `mcp_servers={name: url}` (`agent.mcp_servers` in its YAML; `{name: sandbox}` is the
episode's own sandbox as an MCP server with a `python` tool). The run's MCP server wants the run's key, the
one its OpenAI client carries (`client.api_key`), as `Authorization: Bearer`; this agent sends it to every
server it is given (give a server of your own that must not see it a client of its own). Nothing in it
knows about training.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any


async def run(
    task: Any,
    client: Any,
    sandbox: Any,
    *,
    mcp_servers: dict[str, str],
    model: str = "policy",
    max_turns: int = 3,
) -> str | None:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with contextlib.AsyncExitStack() as stack:
        sessions: dict[str, Any] = {}  # tool name -> the MCP session that serves it
        tools: list[dict] = []
        http = await stack.enter_async_context(  # the MCP SDK's timeouts (30 s, 300 s for reading a stream)
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {client.api_key}"}, timeout=httpx2.Timeout(30, read=300)
            )
        )
        for url in mcp_servers.values():
            read, write, *_ = await stack.enter_async_context(streamable_http_client(url, http_client=http))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            for tool in (await session.list_tools()).tools:
                sessions[tool.name] = session
                fn = {
                    "name": tool.name,
                    "description": tool.description or "",
                    "parameters": tool.input_schema,
                }
                tools.append({"type": "function", "function": fn})
        messages: list[dict] = [{"role": "user", "content": task.problem}]
        for _ in range(max_turns):
            response = await client.chat.completions.create(model=model, messages=messages, tools=tools)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            for call in message.tool_calls:
                result = await call_tool(sessions, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


async def call_tool(sessions: dict[str, Any], name: str, arguments: str) -> str:
    """The tool's text output; a bad call is reported to the model, as an MCP tool error is."""
    if name not in sessions:
        return f"error: no tool named {name!r}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "error: arguments must be a JSON object"
    result = await sessions[name].call_tool(name, args)
    return "".join(getattr(part, "text", "") for part in result.content)
