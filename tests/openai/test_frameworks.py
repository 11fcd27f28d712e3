"""Agent frameworks' structured outputs, each through its real package, against `serve` and the gateway: the
output parses into the framework's type, and on the gateway the recorded tokens and log-probs are the ones the
engine returned, and the session closes (POST /sessions/{id}/close) into trajectories that carry them as behaviour
log-probs: unmasked with the embedded engine (checked against the engine's own report), the masked ones in front
of an engine that reports no unmasked log-probs (`gateway_sglang_api`: the embedded engine's SGLang-native API
through the real `SGLangClient`, as with SGLang)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

openai = pytest.importorskip("openai")
FRONTS = ["serve", "gateway", "gateway_sglang_api"]


class Verdict(BaseModel):
    answer: Literal[12, 13]
    sure: bool


async def check_recorded(fronts, front) -> None:
    if front == "serve":
        return
    calls = fronts.session().calls
    assert calls and all(c.constrained for c in calls)  # every call was constrained
    for c in calls:
        assert len(c.logprobs) == len(c.token_ids) == len(c.versions) and set(c.versions) == {0}
        if front == "gateway":
            assert all(u <= m + 1e-6 for m, u in zip(c.logprobs, c.unmasked_logprobs, strict=True))
        else:  # no unmasked log-probs from this engine: the masked ones stand in, counted
            assert c.unmasked_logprobs is None and c.masked_fallback == len(c.token_ids)
    status, closed = await fronts.close()
    assert status == 200, closed
    trained = [
        lp for t in closed["trajectories"] for lp, m in zip(t["logprobs"], t["loss_mask"], strict=True) if m
    ]
    behaviour = [lp for c in calls for lp in (c.unmasked_logprobs or c.logprobs)]
    assert sorted(trained) == sorted(behaviour) and len(trained) == sum(len(c.token_ids) for c in calls)


@pytest.mark.parametrize("front", FRONTS)
async def test_agents_sdk_output_type_with_chat_and_responses_models(fronts, front):
    agents = pytest.importorskip("agents")
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner

    agents.set_tracing_disabled(True)
    for kind in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        c = openai.AsyncOpenAI(base_url=fronts.base_url(front), api_key="x", max_retries=0)
        agent = Agent(name="judge", output_type=Verdict, model=kind(model="policy", openai_client=c))
        result = await Runner.run(agent, "Is 3 * 4 twelve?")
        assert isinstance(result.final_output, Verdict)
        await check_recorded(fronts, front)


@pytest.mark.parametrize("front", FRONTS)
async def test_langchain_with_structured_output(fronts, front):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="policy", base_url=fronts.base_url(front), api_key="x", max_retries=0)
    for method in ("json_schema", "function_calling"):
        out = await llm.with_structured_output(Verdict, method=method).ainvoke("Is 3 * 4 twelve?")
        assert isinstance(out, Verdict)
    await check_recorded(fronts, front)


@pytest.mark.parametrize("front", FRONTS)
async def test_pydantic_ai_structured_output(fronts, front):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("policy", provider=OpenAIProvider(base_url=fronts.base_url(front), api_key="x"))
    result = await Agent(model, output_type=Verdict).run("Is 3 * 4 twelve?")
    assert isinstance(result.output, Verdict)
    await check_recorded(fronts, front)


@pytest.mark.parametrize("front", FRONTS)
async def test_smolagents_tool_calling_agent_with_tool_choice_required(fronts, front):
    """smolagents sends tool_choice="required" on every step (the grammar forces a call of one of its tools); its
    final_answer here takes a boolean, so the forced call is short, and the agent returns what it parsed.
    (smolagents' stock 2-3k-token system prompt does not fit the toy model's 256-token context: a short one.)"""
    pytest.importorskip("smolagents")
    import asyncio

    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

    class FinalAnswer(Tool):
        name = "final_answer"
        description = "Give the final answer."
        inputs = {"answer": {"type": "boolean", "description": "whether it is true"}}
        output_type = "boolean"

        def forward(self, answer: bool) -> bool:
            return answer

    llm = OpenAIServerModel(  # extra kwargs go into every request: one call per step (smolagents acts on one)
        model_id="policy",
        api_base=fronts.base_url(front),
        api_key="x",
        client_kwargs={"max_retries": 0},
        parallel_tool_calls=False,
    )
    agent = ToolCallingAgent(tools=[FinalAnswer()], model=llm, max_steps=1, verbosity_level=0)
    agent.prompt_templates["system_prompt"] = "Answer with the final_answer tool."
    answer = await asyncio.to_thread(agent.run, "Is 3 * 4 twelve?")
    assert isinstance(answer, bool), [
        getattr(s, "error", None) for s in agent.memory.steps
    ]  # the forced tool call parsed, and smolagents ran its tool on it
    assert agent.memory.steps[-1].tool_calls[0].name == "final_answer"
    await check_recorded(fronts, front)
