"""Structured outputs through `serve` and the gateway, driven by the openai client: response_format, tool_choice
"required" and a named function, parallel_tool_calls, strict tools; the gateway records the masked log-probs
it returned and the unmasked ones, and the trajectory takes the ones `rollout.constrained_logprobs` names."""

from __future__ import annotations

import json

import pytest
from tool_model import QUESTION, TOOLS, conversation

from agent_rl.gateway.assemble import Assembler
from agent_rl.openai import structured
from agent_rl.openai.protocol import ChatReq
from agent_rl.types import Trajectory

openai = pytest.importorskip("openai")

FRONTS = ["serve", "gateway"]
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        # maxLength bounds the call: the tiny model, sampling, need not close a free string within any budget
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 8}},
            "required": ["query"],
        },
    },
}
VERDICT = {
    "type": "json_schema",
    "json_schema": {
        "name": "verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"enum": [12, 13]}, "sure": {"type": "boolean"}},
            "required": ["answer", "sure"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("front", FRONTS)
async def test_response_format_json_schema_parses_and_the_gateway_records_both_logprobs(fronts, front):
    c = fronts.client(front)
    for kind in (VERDICT, {"type": "json_object"}):
        r = await c.chat.completions.create(
            model="policy",
            messages=conversation()[:1],
            response_format=kind,
            max_tokens=60,
            logprobs=True,
            seed=1,
        )
        text = r.choices[0].message.content
        if kind is VERDICT:
            obj = json.loads(text)
            assert obj["answer"] in (12, 13) and isinstance(obj["sure"], bool)
        else:  # any object: the tiny model may not close it within max_tokens, but it is one
            assert text.startswith("{") and (r.choices[0].finish_reason == "length" or json.loads(text))
    if front == "gateway":
        call = fronts.session().calls[0]
        assert [x.logprob for x in r.choices[0].logprobs.content] == list(fronts.session().calls[1].logprobs)
        assert len(call.unmasked_logprobs) == len(call.token_ids)
        assert all(u <= m + 1e-6 for m, u in zip(call.logprobs, call.unmasked_logprobs, strict=True))
        for mode, want in (("unmasked", call.unmasked_logprobs), ("masked", call.logprobs)):
            traj = Trajectory("t", "g", [])
            Assembler(traj, lambda: None, mode).add(call)
            assert traj.segments[0].logprobs == want


@pytest.mark.parametrize("front", FRONTS)
async def test_tool_choice_required_forces_a_call_where_the_model_would_answer(fronts, front):
    c = fronts.client(front)
    free = await c.chat.completions.create(
        model="policy", messages=conversation(), tools=TOOLS, temperature=0
    )
    assert free.choices[0].message.tool_calls is None  # the model answers "The answer is 12."
    r = await c.chat.completions.create(
        model="policy",
        messages=conversation(),
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=80,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls
    for call in ch.message.tool_calls:
        assert call.function.name == "python" and isinstance(json.loads(call.function.arguments)["code"], str)


@pytest.mark.parametrize("front", FRONTS)
async def test_a_named_function_is_the_one_called_with_arguments_of_its_schema(fronts, front):
    c = fronts.client(front)
    r = await c.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": QUESTION}],
        tools=[*TOOLS, SEARCH],
        tool_choice={"type": "function", "function": {"name": "search"}},
        # every token is at least one byte: the call's frame (~70 bytes) and 8 characters of at most 12 bytes
        # each (a JSON surrogate-pair escape) fit, whatever is sampled
        max_tokens=200,
        seed=2,
    )
    (call,) = r.choices[0].message.tool_calls
    query = json.loads(call.function.arguments)["query"]
    assert call.function.name == "search" and isinstance(query, str) and len(query) <= 8


@pytest.mark.parametrize("front", FRONTS)
async def test_strict_tools_under_auto_leave_text_free_and_check_calls(fronts, front):
    c = fronts.client(front)
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    r = await c.chat.completions.create(
        model="policy", messages=conversation()[:1], tools=strict, temperature=0, parallel_tool_calls=False
    )
    (call,) = r.choices[0].message.tool_calls  # the model's own call, accepted by the grammar
    assert json.loads(call.function.arguments) == {"code": "print(3 * 4)"}
    r = await c.chat.completions.create(model="policy", messages=conversation(), tools=strict, temperature=0)
    assert r.choices[0].message.content == "The answer is 12."  # free text stays free


def req(**kw) -> ChatReq:
    return ChatReq(messages=[{"role": "user", "content": "x"}], **kw)


def test_which_constraint_each_request_gets():
    tools = [*TOOLS, SEARCH]
    assert structured.for_chat(req(), "hermes") == structured.Structure()
    assert (
        structured.for_chat(req(response_format={"type": "json_object"}), "hermes").constraint.kind
        == "json_schema"
    )
    one = structured.for_chat(req(tools=tools, tool_choice="required", parallel_tool_calls=False), "hermes")
    many = structured.for_chat(req(tools=tools, tool_choice="required"), "hermes")
    assert one.constraint.kind == many.constraint.kind == "ebnf"
    assert "agentrl_call" in many.constraint.value and "agentrl_call" not in one.constraint.value
    both = structured.for_chat(req(tools=tools, response_format=VERDICT), "hermes")
    assert both.constraint.kind == "ebnf" and both.stop == ()
    assert structured.for_chat(req(tools=tools, parallel_tool_calls=False), "hermes") == structured.Structure(
        None, ("</tool_call>",)
    )
    with pytest.raises(ValueError, match="tool parser is 'none'"):
        structured.for_chat(req(tools=tools, tool_choice="required"), "none")


def test_qwen_is_the_hermes_format_for_constrained_decoding():
    """`--tool-parser qwen` (Qwen3's) is the same parser as hermes: every structured option is enforced alike."""
    tools = [*TOOLS, SEARCH]
    named = {"type": "function", "function": {"name": "search"}}
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    for kw in (
        {"tools": tools, "tool_choice": "required"},
        {"tools": tools, "tool_choice": named},
        {"tools": strict},
        {"tools": tools, "response_format": VERDICT},
    ):
        assert structured.for_chat(req(**kw), "qwen") == structured.for_chat(req(**kw), "hermes")
        assert structured.for_chat(req(**kw), "qwen").constraint is not None
    with pytest.raises(ValueError, match="use hermes or qwen"):
        structured.for_chat(req(tools=tools, tool_choice="required"), "llama3_json")
