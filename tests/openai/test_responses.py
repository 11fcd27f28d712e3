"""The Responses API on `serve` and the gateway: function tools and function_call_output, previous_response_id
(one trajectory on the gateway), streaming events; and the Agents SDK's default OpenAIResponsesModel, unmodified."""

from __future__ import annotations

import json

import pytest
from tool_model import CODE, FINAL, QUESTION, TOOLS

from agent_rl.gateway.assemble import assemble

openai = pytest.importorskip("openai")
FRONTS = ["serve", "gateway"]
RESPONSE_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("chained", [False, True])
async def test_function_call_round_trip_and_previous_response_id(fronts, front, chained):
    c = fronts.client(front)
    first = await c.responses.create(model="policy", input=QUESTION, tools=RESPONSE_TOOLS, temperature=0)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "python" and json.loads(call.arguments) == {"code": CODE}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "12"}
    if chained:  # the server remembers the conversation
        second = await c.responses.create(
            model="policy", previous_response_id=first.id, input=[result], tools=RESPONSE_TOOLS, temperature=0
        )
    else:  # the client sends the whole history, as the Agents SDK does by default
        history = [{"role": "user", "content": QUESTION}, *[o.model_dump() for o in first.output], result]
        second = await c.responses.create(model="policy", input=history, tools=RESPONSE_TOOLS, temperature=0)
    assert second.output_text == FINAL and second.status == "completed"
    if front == "gateway":
        s = fronts.session()
        trajectories, splits = assemble(s.calls)
        assert splits == 0 and [c.extended for c in s.calls] == [False, True]  # one trajectory, extended


@pytest.mark.parametrize("front", FRONTS)
async def test_streamed_response_events_end_with_the_completed_response(fronts, front):
    c = fronts.client(front)
    events = [
        e
        async for e in await c.responses.create(
            model="policy", input=QUESTION, tools=RESPONSE_TOOLS, temperature=0, stream=True
        )
    ]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    done = events[-1].response
    assert [o.type for o in done.output] == ["function_call"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("front", FRONTS)
async def test_the_agents_sdk_default_responses_model_runs_unmodified(fronts, front):
    agents = pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool

    ran = []

    @function_tool
    def python(code: str) -> str:
        """Run Python code and return what it prints."""
        ran.append(code)
        return "12"

    model = OpenAIResponsesModel(model="policy", openai_client=fronts.client(front))
    agent = Agent(name="calc", tools=[python], model=model, model_settings=ModelSettings(temperature=0))
    agents.set_tracing_disabled(True)
    result = await Runner.run(agent, QUESTION)
    assert ran == [CODE] and result.final_output == FINAL
    if front == "gateway":
        calls = fronts.session().calls
        (traj,), splits = assemble(calls)
        sampled = [s for s in traj.segments if s.sampled]
        assert [s.token_ids for s in sampled] == [c.token_ids for c in calls]
