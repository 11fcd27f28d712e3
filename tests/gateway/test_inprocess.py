"""The official openai client served in-process (`Gateway.client`, gateway/inprocess.py): the same answers,
recordings and errors as over HTTP, no HTTP server for chat completions, other routes through the server."""

from __future__ import annotations

import json

import pytest
from float_bounds import TINY_LOGPROB_ATOL
from tool_model import CODE, FINAL, QUESTION, TOOLS, conversation

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.gateway.record import SessionLimits
from agent_rl.gateway.server import Gateway

openai = pytest.importorskip("openai")


@pytest.fixture
async def engine(tool_model):
    eng = EmbeddedEngine(tool_model, EngineOptions(max_batch=8, max_seq_len=512), seed=0)
    yield eng
    await eng.close()


@pytest.fixture
def tokenizer(tool_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model)


async def _agent(client) -> tuple[dict, str]:
    """The function-calling round trip: the tool call the model makes, then its final answer."""
    first = await client.chat.completions.create(model="policy", messages=conversation()[:1], tools=TOOLS)
    (call,) = first.choices[0].message.tool_calls
    messages = [
        *conversation()[:1],
        first.choices[0].message.model_dump(),
        {"role": "tool", "tool_call_id": call.id, "content": "12"},
    ]
    second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return json.loads(call.function.arguments), second.choices[0].message.content


async def test_the_in_process_client_records_exactly_what_the_http_client_records(engine, tokenizer):
    inproc, http = (Gateway(engine, tokenizer, max_seq_len=512) for _ in range(2))
    await http.start()
    answers, calls = [], []
    try:
        for gw, client in ((inproc, lambda: inproc.client("ep")), (http, lambda: _http(http, "ep"))):
            gw.open("ep", sampling=SamplingParams(temperature=0.0))
            c = client()
            try:
                answers.append(await _agent(c))
            finally:
                await c.close()
            calls.append(gw.close_session("ep").calls)
    finally:
        await http.close()
        await inproc.close()
    assert answers[0] == answers[1] == ({"code": CODE}, FINAL)
    a, b = calls
    assert [(c.prompt_ids, c.token_ids, c.versions, c.extended) for c in a] == [
        (c.prompt_ids, c.token_ids, c.versions, c.extended) for c in b
    ]
    # The same engine serves both sessions, the second from its prefix cache (a prefill of fewer rows rounds
    # differently): the log-probs agree up to float32 rounding of the tiny model, not bit for bit.
    for x, y in zip(a, b, strict=True):
        assert len(x.logprobs) == len(y.logprobs)
        assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs, strict=True)) <= TINY_LOGPROB_ATOL
    assert [c.extended for c in a] == [False, True]
    assert inproc.url is None, "chat completions in-process start no HTTP server"


def _http(gw: Gateway, sid: str):
    return openai.AsyncOpenAI(base_url=gw.base_url(sid), api_key="x", max_retries=0)


async def test_the_in_process_client_gets_the_errors_the_http_gateway_answers(engine, tokenizer):
    gw = Gateway(engine, tokenizer, max_seq_len=512)
    await gw.start()
    seen = {}
    try:
        for name, client in (("in-process", gw.client), ("http", lambda sid: _http(gw, sid))):
            sid = f"budget-{name}"
            gw.open(sid, limits=SessionLimits(max_calls=1))
            c, gone = client(sid), client(f"never-opened-{name}")
            msgs = [{"role": "user", "content": QUESTION}]
            try:
                await c.chat.completions.create(model="p", messages=msgs, max_tokens=4)
                with pytest.raises(openai.APIStatusError, match="call budget") as over:
                    await c.chat.completions.create(model="p", messages=msgs, max_tokens=4)
                with pytest.raises(openai.BadRequestError) as bad:
                    await c.chat.completions.create(model="p", messages=msgs, n=0)
                with pytest.raises(openai.NotFoundError, match="no open session") as missing:
                    await gone.chat.completions.create(model="p", messages=msgs)
            finally:
                await c.close()
                await gone.close()
            seen[name] = [(e.value.status_code, e.value.body["type"]) for e in (over, bad, missing)]
    finally:
        await gw.close()
    assert (
        seen["in-process"]
        == seen["http"]
        == [
            (410, "invalid_request_error"),
            (400, "invalid_request_error"),
            (404, "not_found_error"),
        ]
    )


async def test_the_in_process_client_reaches_other_routes_through_the_gateway_http_server(engine, tokenizer):
    gw = Gateway(engine, tokenizer, max_seq_len=512)
    gw.open("ep", sampling=SamplingParams(temperature=0.0))
    c = gw.client("ep")
    try:
        tools = [{"type": "function", **TOOLS[0]["function"]}]
        first = await c.responses.create(model="policy", input=QUESTION, tools=tools)
    finally:
        await c.close()
        await gw.close()
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert json.loads(call.arguments) == {"code": CODE}
    assert gw.url is not None, "the Responses API went to the HTTP server, started at its first use"
    assert len(gw.close_session("ep").calls) == 1, "and was recorded in the same session"
