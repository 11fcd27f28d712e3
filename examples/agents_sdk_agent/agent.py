"""The arithmetic agent written with the OpenAI Agents SDK (`pip install openai-agents`): a `python` function
tool that runs in the sandbox, the SDK's Runner loop, and its default model, the Responses API.

An agent-rl entrypoint (`type: agent`, examples/agents_sdk_agent/env.yaml): the run hands it an
`openai.AsyncOpenAI` bound to the episode's gateway session, and the SDK's model object takes it as is. The
tool and the prompt (the problem as the only user message, no instructions) are those of
examples/arith_agent, so the agent_arith warm start (Hermes tool calls) fits it: `python -m
examples.agents_sdk_agent.train` trains it from there.
"""

from __future__ import annotations

from typing import Any

DESCRIPTION = "Run Python code in a sandbox and return what it prints."


async def run(
    task: Any, client: Any, sandbox: Any, *, model: str = "policy", max_turns: int = 3, api: str = "responses"
) -> str | None:
    """Answer `task.problem`; the final output's text (the env scores it), or None when the turns ran out."""
    from agents import (
        Agent,
        FunctionTool,
        MaxTurnsExceeded,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        function_tool,
    )

    @function_tool(name_override="python", description_override=DESCRIPTION)
    async def python(code: str) -> str:
        """Run Python code.

        Args:
            code: the program
        """
        return await sandbox.run(code)

    assert isinstance(python, FunctionTool)
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(name="calculator", model=kind(model=model, openai_client=client), tools=[python])
    try:
        result = await Runner.run(
            agent, task.problem, max_turns=max_turns, run_config=RunConfig(tracing_disabled=True)
        )
    except MaxTurnsExceeded:
        return None
    return str(result.final_output)
