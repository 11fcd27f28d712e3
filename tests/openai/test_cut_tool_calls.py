"""A reply of two tool calls cut by max_tokens inside the second: the complete first call comes back as a tool
call with finish_reason "length" (chat, streamed or not) and as a function_call item of an `incomplete` response
(Responses API), on `serve` and on the gateway; the gateway still records every sampled token. Before, the whole
reply came back as content with no tool calls."""

from __future__ import annotations

import json

import pytest
from tool_model import CALL, CODE, QUESTION, TOOLS, TWO_CALLS

openai = pytest.importorskip("openai")
FRONTS = ["serve", "gateway"]
USER = [{"role": "user", "content": QUESTION}]


def cut_budget(model_dir) -> int:
    """Tokens of the two-call reply up to a few characters into the second call's JSON."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(TWO_CALLS, add_special_tokens=False)["input_ids"]
    k = next(k for k in range(len(ids)) if tok.decode(ids[:k]).startswith(CALL + '\n<tool_call>\n{"na'))
    assert k < len(ids) - 5  # well inside the second call
    return k


def client(fronts, front):
    return openai.AsyncOpenAI(base_url=fronts.base_url(front), api_key="x", max_retries=0)


def first_call_only(calls) -> None:
    (call,) = calls
    assert call.function.name == "python" and json.loads(call.function.arguments) == {"code": CODE}


@pytest.mark.parametrize("front", FRONTS)
async def test_chat_keeps_the_complete_calls_before_one_cut_by_max_tokens(
    two_calls_fronts, two_calls_model, front
):
    fronts = two_calls_fronts
    c = client(fronts, front)
    whole = await c.chat.completions.create(model="policy", messages=USER, tools=TOOLS, temperature=0)
    assert whole.choices[0].finish_reason == "tool_calls" and len(whole.choices[0].message.tool_calls) == 2
    k = cut_budget(two_calls_model)
    c = client(fronts, front)
    r = await c.chat.completions.create(
        model="policy", messages=USER, tools=TOOLS, temperature=0, max_tokens=k
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == k
    first_call_only(r.choices[0].message.tool_calls)
    if front == "gateway":  # the trajectory keeps every sampled token, the cut call's too
        assert len(fronts.session().calls[0].token_ids) == k
    stream = await client(fronts, front).chat.completions.create(
        model="policy", messages=USER, tools=TOOLS, temperature=0, max_tokens=k, stream=True
    )
    chunks = [ch async for ch in stream]
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert finish == ["length"]
    first_call_only(calls)


@pytest.mark.parametrize("front", FRONTS)
async def test_responses_keep_the_complete_calls_of_an_incomplete_response(
    two_calls_fronts, two_calls_model, front
):
    k = cut_budget(two_calls_model)
    c = client(two_calls_fronts, front)
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    r = await c.responses.create(
        model="policy", input=QUESTION, tools=tools, temperature=0, max_output_tokens=k
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert (
        item.type == "function_call"
        and item.name == "python"
        and json.loads(item.arguments) == {"code": CODE}
    )
