"""The arithmetic agent written with pydantic-ai (`pip install 'pydantic-ai-slim[openai]'`): an Agent with a
`python` tool over OpenAIChatModel, whose provider takes the episode's client as is.

An agent-rl entrypoint (`type: agent`, examples/pydantic_ai_agent/env.yaml). Same tool and prompt as
examples/arith_agent.
"""

from __future__ import annotations

from typing import Any

DESCRIPTION = "Run Python code in a sandbox and return what it prints."


async def run(
    task: Any, client: Any, sandbox: Any, *, model: str = "policy", max_turns: int = 3
) -> str | None:
    """Answer `task.problem`; the final text, or None when the model-request limit ran out."""
    from pydantic_ai import Agent, Tool, UsageLimitExceeded, UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def python(code: str) -> str:
        return await sandbox.run(code)

    agent = Agent(
        OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)),
        tools=[Tool(python, name="python", description=DESCRIPTION)],
    )
    try:
        result = await agent.run(task.problem, usage_limits=UsageLimits(request_limit=max_turns))
    except UsageLimitExceeded:
        return None
    return result.output
