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
