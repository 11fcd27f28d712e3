"""The arithmetic agent written with smolagents (`pip install smolagents`): a ToolCallingAgent with a `python`
tool and smolagents' `final_answer` tool, calling the model with `tool_choice="required"` on every step.

smolagents is synchronous: the agent runs in a worker thread (`asyncio.to_thread`) with its own sync OpenAI
client pointed at the episode's gateway session, and its tool hands each program back to the event loop's
sandbox. Its stock system prompt is 2-3k tokens of worked examples; `system_prompt` replaces it with a short
one so that a small-context model can take it (pass `system_prompt=None` for the stock prompt).
An agent-rl entrypoint (`type: agent`, examples/smolagents_agent/env.yaml).
"""

from __future__ import annotations

import asyncio
from typing import Any

SHORT_PROMPT = (
    "Solve the task. Call the `python` tool to compute, then call `final_answer` with the answer.\n"
    "{%- for tool in tools.values() %}\n- {{ tool.name }}: {{ tool.description }}{%- endfor %}"
)


def make_agent(
    api_base: str,
    sandbox_run: Any,
    *,
    model: str,
    max_steps: int,
    system_prompt: str | None,
    api_key: str = "agent-rl",
) -> Any:
    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

    class Python(Tool):
        name = "python"
        description = "Run Python code in a sandbox and return what it prints."
        inputs = {"code": {"type": "string", "description": "the program"}}
        output_type = "string"

        def forward(self, code: str) -> str:
            return sandbox_run(code)

    llm = OpenAIServerModel(
        model_id=model, api_base=api_base, api_key=api_key, client_kwargs={"max_retries": 0}
    )
    agent = ToolCallingAgent(tools=[Python()], model=llm, max_steps=max_steps, verbosity_level=0)
    if system_prompt is not None:
        agent.prompt_templates["system_prompt"] = system_prompt
    return agent


async def run(
    task: Any,
    client: Any,
    sandbox: Any,
    *,
    model: str = "policy",
    max_steps: int = 2,
    system_prompt: str | None = SHORT_PROMPT,
) -> str | None:
    """Answer `task.problem`; smolagents' final answer as text (None if it gave none)."""
    loop = asyncio.get_running_loop()

    def sandbox_run(code: str) -> str:  # called in the agent's thread: run on the loop, wait for the result
        return asyncio.run_coroutine_threadsafe(sandbox.run(code), loop).result()

    agent = make_agent(
        str(client.base_url), sandbox_run, model=model, max_steps=max_steps, system_prompt=system_prompt,
        api_key=client.api_key,  # the run's key: the gateway refuses requests without it
    )  # fmt: skip
    answer = await asyncio.to_thread(agent.run, task.problem)
    return None if answer is None else str(answer)
