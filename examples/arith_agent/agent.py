"""An ordinary OpenAI function-calling agent: a `python` tool that runs in the sandbox, then a final answer.

Nothing in it knows about training: point `client` at OpenAI, at `agent-rl serve`, or (as the
`tiny_arith_agent` env does during RL) at the recording gateway's session URL.

    answer = await run(task, openai.AsyncOpenAI(base_url=..., api_key=...), sandbox)
"""

from __future__ import annotations

import json
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code in a sandbox and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"],
            },
        },
    }
]


async def run(
    task: Any, client: Any, sandbox: Any, *, model: str = "policy", max_turns: int = 3
) -> str | None:
    """Answer `task.problem`; returns the final message's text (the env scores it), or None if no answer came."""
    messages: list[dict] = [{"role": "user", "content": task.problem}]
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            try:
                code = json.loads(call.function.arguments)["code"]
                result = await sandbox.run(code) if call.function.name == "python" else "unknown tool"
            except (json.JSONDecodeError, KeyError, TypeError):
                result = "error: arguments must be a JSON object with a 'code' string"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
