"""The official `anthropic` SDK, unmodified, against `agent-rl serve` and the gateway (one embedded engine on the tool
model, tests/anthropic_fronts.py): create, stream, tools and tool_result, count_tokens, stop reasons, tool_choice,
errors; and the raw event stream in Anthropic's exact order.

temperature is not a parameter of the SDK's `create` any more (newer Claude models refuse it); the API still takes
it, so the tests send it as `extra_body` for greedy decoding, which reproduces the tool model's round trip.
"""

from __future__ import annotations

import itertools
import json

import httpx
import pytest
from anthropic_fronts import messages_fronts
from tool_model import CODE, FINAL, QUESTION, TOOLS

anthropic = pytest.importorskip("anthropic")
FRONTS = ["serve", "gateway"]
PYTHON = {
    "name": "python",
    "description": TOOLS[0]["function"]["description"],
    "input_schema": TOOLS[0]["function"]["parameters"],
}
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": QUESTION}]
_sessions = itertools.count()


@pytest.fixture(scope="module")
def fronts(tool_model):
    with messages_fronts(tool_model, max_seq_len=512) as f:
        yield f


def base_url(fronts, front: str) -> str:
    return fronts.serve_url if front == "serve" else fronts.open(f"sdk-{next(_sessions)}")


def client(fronts, front: str, **kw):
    kw.setdefault("api_key", fronts.key)
    return anthropic.Anthropic(base_url=base_url(fronts, front), max_retries=0, **kw)


def answered(first) -> list[dict]:
    """The first reply's tool call sent back with its result, as an agent continues."""
    (use,) = [b for b in first.content if b.type == "tool_use"]
    return [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "12"}]}
            ],
        },
    ]


def create(c, messages, **kw):
    kw.setdefault("max_tokens", 128)
    kw.setdefault("tools", [PYTHON])
    return c.messages.create(model="policy", messages=messages, extra_body=GREEDY, **kw)


@pytest.mark.parametrize("front", FRONTS)
def test_tool_use_then_tool_result_continuation(fronts, front):
    c = client(fronts, front)
    first = create(c, ASK)
    assert first.stop_reason == "tool_use" and first.role == "assistant" and first.model == "policy"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "python" and use.input == {"code": CODE}
    assert use.id.startswith("toolu_")
    second = create(c, answered(first))
    assert second.stop_reason == "end_turn" and second.stop_sequence is None
    assert [(b.type, b.text) for b in second.content] == [("text", FINAL)]
    assert second.usage.input_tokens > first.usage.input_tokens and second.usage.output_tokens > 0


@pytest.mark.parametrize("front", FRONTS)
def test_stream_gives_the_message_create_gives(fronts, front):
    c = client(fronts, front)
    first = create(c, ASK)
    with c.messages.stream(
        model="policy", max_tokens=128, messages=ASK, tools=[PYTHON], extra_body=GREEDY
    ) as s:
        kinds = [e.type for e in s]
        streamed = s.get_final_message()
    assert "input_json" in kinds  # the SDK's event for an input_json_delta
    assert streamed.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in streamed.content] == [
        (b.type, b.name, b.input) for b in first.content
    ]
    assert streamed.usage.output_tokens == first.usage.output_tokens
    with c.messages.stream(
        model="policy", max_tokens=64, messages=answered(first), tools=[PYTHON], extra_body=GREEDY
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == FINAL and final.stop_reason == "end_turn"


def sse(fronts, front: str, messages: list[dict], max_tokens: int = 128) -> list[tuple[str, dict]]:
    """The raw events of a streamed request: (event line, JSON data), in order."""
    body = {
        "model": "policy",
        "max_tokens": max_tokens,
        "messages": messages,
        "tools": [PYTHON],
        "stream": True,
    }
    headers = {"x-api-key": fronts.key, "anthropic-version": "2023-06-01"}
    r = httpx.post(
        f"{base_url(fronts, front)}/v1/messages?beta=true", json={**body, **GREEDY}, headers=headers
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = []
    for chunk in r.text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


@pytest.mark.parametrize("front", FRONTS)
def test_raw_event_stream_is_in_anthropics_order_with_input_json_delta(fronts, front):
    events = sse(fronts, front, ASK)
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    block = events[1][1]
    assert block["index"] == 0 and block["content_block"]["type"] == "tool_use"
    assert block["content_block"]["input"] == {} and block["content_block"]["name"] == "python"
    delta = events[3][1]
    assert delta["index"] == 0 and delta["delta"]["type"] == "input_json_delta"
    assert json.loads(delta["delta"]["partial_json"]) == {"code": CODE}
    assert events[4][1]["index"] == 0
    done = events[5][1]
    assert done["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert done["usage"]["output_tokens"] > 0


@pytest.mark.parametrize("front", FRONTS)
def test_raw_event_stream_of_a_text_reply(fronts, front):
    first = create(client(fronts, front), ASK)
    events = sse(fronts, front, answered(first), max_tokens=64)
    assert [n for n, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}
    assert events[3][1]["delta"] == {"type": "text_delta", "text": FINAL}
    assert events[5][1]["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize("front", FRONTS)
def test_count_tokens_is_the_rendered_prompts_length(fronts, front, tool_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model)
    c = client(fronts, front)
    first = create(c, ASK)
    counted = c.messages.count_tokens(model="policy", messages=ASK, tools=[PYTHON])
    rendered = tok.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert counted.input_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert counted.input_tokens == first.usage.input_tokens
    messages = answered(first)
    chat = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "python", "arguments": {"code": CODE}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "12"},
    ]
    rendered = tok.apply_chat_template(chat, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    counted = c.messages.count_tokens(model="policy", messages=messages, tools=[PYTHON])
    assert counted.input_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("front", FRONTS)
def test_stop_reasons_stop_sequence_and_max_tokens(fronts, front):
    c = client(fronts, front)
    messages = answered(create(c, ASK))
    stopped = create(c, messages, max_tokens=64, stop_sequences=["zzz", " is"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " is"
    assert stopped.content[0].text == FINAL[: FINAL.index(" is")]
    cut = create(c, messages, max_tokens=2)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


@pytest.mark.parametrize("front", FRONTS)
def test_tool_choice_named_tool_and_none(fronts, front):
    c = client(fronts, front)
    first = create(c, ASK)
    # after the result the model answers in text; a named tool makes it call that tool (constrained decoding)
    forced = create(c, answered(first), tool_choice={"type": "tool", "name": "python"})
    assert forced.stop_reason == "tool_use" and [b.name for b in forced.content] == ["python"]
    single = create(c, ASK, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert single.stop_reason == "tool_use" and len(single.content) == 1
    # none: the same output is plain text, no tool_use
    plain = create(c, ASK, tool_choice={"type": "none"})
    assert plain.stop_reason == "end_turn" and [b.type for b in plain.content] == ["text"]
    assert plain.content[0].text.startswith("<tool_call>")


@pytest.mark.parametrize("front", FRONTS)
def test_errors_raise_the_sdks_exceptions_with_anthropics_body(fronts, front):
    c = client(fronts, front)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="policy", max_tokens=8, messages=[])
    assert (
        e.value.body["error"]["type"] == "invalid_request_error"
        and "messages" in e.value.body["error"]["message"]
    )
    with pytest.raises(anthropic.AuthenticationError) as e:
        create(client(fronts, front, api_key="wrong"), ASK)
    assert e.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": e.value.body["error"]["message"]},
    }
    # the key as a bearer token (the SDK's auth_token) is as good as x-api-key
    bearer = anthropic.Anthropic(
        base_url=base_url(fronts, front), auth_token=fronts.key, api_key=None, max_retries=0
    )
    assert create(bearer, ASK).stop_reason == "tool_use"
    with pytest.raises(anthropic.NotFoundError) as e:
        if front == "serve":  # a model serve does not serve
            c.messages.create(model="claude-nonesuch", max_tokens=8, messages=ASK)
        else:  # a session that is not open
            gone = anthropic.Anthropic(
                base_url=f"{fronts.gateway.url}/sessions/nonesuch", api_key=fronts.key, max_retries=0
            )
            create(gone, ASK)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("front", FRONTS)
def test_models_list_in_anthropics_shape_for_anthropic_clients_only(fronts, front):
    url = base_url(fronts, front)
    (model,) = anthropic.Anthropic(base_url=url, api_key=fronts.key, max_retries=0).models.list().data
    assert model.type == "model" and model.id == ("policy" if front == "serve" else "agent-rl-policy")
    openai_shape = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {fronts.key}"}).json()
    assert openai_shape["object"] == "list" and openai_shape["data"][0]["object"] == "model"


@pytest.mark.parametrize("front", FRONTS)
def test_the_key_as_x_api_key_as_claude_code_sends_it(fronts, front):
    """This SDK sends its api_key as a bearer token; Claude Code (and older SDKs) send `x-api-key`."""
    url = f"{base_url(fronts, front)}/v1/messages"
    body = {"model": "policy", "max_tokens": 4, "messages": ASK}
    ok = httpx.post(url, json=body, headers={"x-api-key": fronts.key, "anthropic-version": "2023-06-01"})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    wrong = httpx.post(url, json=body, headers={"x-api-key": "wrong", "anthropic-version": "2023-06-01"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    none = httpx.post(url, json=body)
    assert none.status_code == 401 and none.json()["type"] == "error"
