"""Every client mistake is a 4xx in OpenAI's error body, on `serve` and on the gateway, streamed or not; the
gateway counts it as the agent's (client_errors), never as an engine failure (errors, 502)."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

FRONTS = ["serve", "gateway"]
USER = {"role": "user", "content": "Compute 3 * 4"}


def client(fronts, front):
    return openai.AsyncOpenAI(base_url=fronts.base_url(front), api_key="x", max_retries=0)


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_template_that_raises_is_a_400_naming_messages(fronts, front, stream):
    c = client(fronts, front)
    bad = [USER, {"role": "system", "content": "late"}]
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model="policy", messages=bad, stream=stream)
    body = e.value.body
    assert body["param"] == "messages" and body["type"] == "invalid_request_error"
    assert "System message must be at the beginning" in body["message"]
    if front == "gateway":
        s = fronts.session()
        assert s.stats.errors == [] and len(s.stats.client_errors) == 1


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_longer_than_the_context_is_a_400_before_any_stream(fronts, front, stream):
    c = client(fronts, front)
    long = [{"role": "user", "content": "Compute 3 * 4 " * 200}]
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model="policy", messages=long, stream=stream)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.status_code == 400
    if front == "gateway":
        assert fronts.session().stats.errors == []


@pytest.mark.parametrize("front", FRONTS)
async def test_unsupported_values_are_400s_that_name_field_and_value(fronts, front):
    c = client(fronts, front)
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model="policy", messages=[USER], presence_penalty=0.5)
    assert e.value.body["param"] == "presence_penalty" and "0.5" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model="policy", messages=[USER], response_format={"type": "yaml"})
    assert e.value.body["param"] == "response_format" and "'yaml'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(
            model="policy",
            messages=[USER],
            tools=[],
            tool_choice={"type": "function", "function": {"name": "x"}},
        )
    assert e.value.body["param"] == "tool_choice"


async def test_top_logprobs_through_the_gateway_are_the_engines(fronts):
    c = client(fronts, "gateway")
    r = await c.chat.completions.create(
        model="policy", messages=[USER], max_tokens=6, logprobs=True, top_logprobs=3, temperature=0
    )
    (call,) = fronts.session().calls
    content = r.choices[0].logprobs.content
    assert [x.logprob for x in content] == list(call.logprobs)
    assert all(len(x.top_logprobs) == 3 for x in content)
    for x, top in zip(content, call.top_logprobs, strict=True):
        assert [t.logprob for t in x.top_logprobs] == [lp for _, lp in top]
        assert x.top_logprobs[0].logprob == pytest.approx(x.logprob)  # greedy: the sampled token is the top


async def test_an_engine_that_is_gone_is_a_502_counted_as_an_engine_failure(fronts):
    c = client(fronts, "gateway")
    await fronts.engine.close()
    with pytest.raises(openai.InternalServerError) as e:
        await c.chat.completions.create(model="policy", messages=[USER], max_tokens=4)
    assert e.value.status_code == 502
    s = fronts.session()
    assert len(s.stats.errors) == 1 and s.stats.client_errors == []


@pytest.mark.parametrize("front", FRONTS)
async def test_values_the_engine_refuses_are_400s_found_when_the_request_is_read(fronts, front):
    c = client(fronts, front)
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model="policy", messages=[USER], temperature=-1)
    assert e.value.body["param"] == "temperature" and "-1" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # the grammar ends at EOS: refused before sampling
        await c.chat.completions.create(
            model="policy",
            messages=[USER],
            response_format={"type": "json_object"},
            extra_body={"ignore_eos": True},
        )
    assert e.value.body["param"] == "ignore_eos"
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as e:  # a tool schema xgrammar cannot compile
        await c.chat.completions.create(model="policy", messages=[USER], tools=[bad], tool_choice="required")
    assert e.value.body["param"] == "tools[f].function.parameters" and "nonsense" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # a Responses input item without its call_id
        await c.responses.create(model="policy", input=[{"type": "function_call_output", "output": "12"}])
    assert "'call_id'" in e.value.body["message"] and e.value.body["param"] == "input"
    if front == "gateway":
        s = fronts.session()
        assert s.stats.errors == [] and len(s.stats.client_errors) == 4


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]"])
async def test_a_body_that_is_no_json_object_is_a_400(fronts, front, raw):
    import aiohttp

    url = fronts.base_url(front) + "/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, data=raw) as r:
        assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_server_bug_is_a_500_with_its_traceback_in_the_log_never_a_client_error(
    fronts, front, api, monkeypatch, caplog
):
    """A KeyError from inside the server (an injected bug: the structured-output planner raises) is no client
    mistake: a 500 whose message names it, its traceback in the server's log, and on the gateway it counts as the
    gateway's error (the episode fails as infrastructure), not as the agent's."""
    from agent_rl.openai import structured

    def broken(req, parser):
        raise KeyError("injected bug")

    monkeypatch.setattr(structured, "for_chat", broken)
    c = client(fronts, front)
    with (
        caplog.at_level("ERROR", logger="agent_rl.openai.errors"),
        pytest.raises(openai.InternalServerError) as e,
    ):
        if api == "chat":
            await c.chat.completions.create(model="policy", messages=[USER], max_tokens=4)
        else:
            await c.responses.create(model="policy", input="Compute 3 * 4", max_output_tokens=4)
    assert e.value.status_code == 500 and e.value.body["type"] == "server_error"
    assert "KeyError" in e.value.body["message"] and "injected bug" in e.value.body["message"]
    (record,) = [
        r for r in caplog.records if r.exc_info and r.name == "agent_rl.openai.errors"
    ]  # not asyncio's
    assert record.exc_info[0] is KeyError and "in broken" in caplog.text  # the traceback, down to the raise
    if front == "gateway":
        s = fronts.session()
        assert s.stats.client_errors == [] and len(s.stats.errors) == 1
