"""`agent-rl serve` driven by the official openai client: function calling, streaming, n, top log-probs, errors.

The model is the session's tiny model over-fitted (tests/tool_model.py) to answer "Compute 3 * 4" with a
Hermes tool call and the tool result with "The answer is 12.", so greedy decoding gives a real round trip.
"""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
import torch
from float_bounds import logprob_atol
from tool_model import CODE, FINAL, QUESTION, TOOLS, conversation

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tool_model):
    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.launch import launch_embedded

    handle = launch_embedded(str(tool_model), EngineOptions(max_batch=16, max_seq_len=512), threads=1)
    yield handle
    handle.stop()


@pytest.fixture
async def client(served):
    c = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    yield c
    await c.close()


@pytest.fixture(scope="module")
def hf(tool_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tool_model, dtype=torch.float32).eval()


async def model_id(client) -> str:
    return (await client.models.list()).data[0].id


async def test_function_calling_round_trip_with_tool_role_message(client):
    model = await model_id(client)
    first = await client.chat.completions.create(
        model=model, messages=conversation()[:1], tools=TOOLS, temperature=0, max_tokens=128
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "python"
    assert json.loads(call.function.arguments) == {"code": CODE}
    # the agent sends the assistant message back as the client returned it (content None, tool_calls)
    messages = [
        *conversation()[:1],
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "12"},
    ]
    second = await client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=32
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == FINAL and not second.choices[0].message.tool_calls


async def test_tool_choice_none_leaves_the_call_as_plain_text(client):
    r = await client.chat.completions.create(
        model=await model_id(client),
        messages=conversation()[:1],
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=128,
    )
    msg = r.choices[0].message
    assert (
        not msg.tool_calls and msg.content.startswith("<tool_call>") and r.choices[0].finish_reason == "stop"
    )


async def test_developer_role_text_parts_and_name_render_like_system_and_plain_text(client):
    model = await model_id(client)
    plain = await client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
        max_tokens=1,
        temperature=0,
    )
    parts = await client.chat.completions.create(
        model=model,
        messages=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "name": "alice",
                "content": [{"type": "text", "text": "Compute "}, {"type": "text", "text": "3 * 4"}],
            },
        ],
        max_tokens=1,
        temperature=0,
    )
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens
    assert parts.choices[0].message.content == plain.choices[0].message.content


async def test_streaming_deltas_concatenate_to_the_non_streamed_answer_and_usage_comes_last(client):
    model = await model_id(client)
    messages = [*conversation()[:1], conversation()[1], conversation()[2]]
    whole = await client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=32)
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == FINAL
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # token by token
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_streamed_tool_call_arrives_parsed_in_the_final_delta(client):
    stream = await client.chat.completions.create(
        model=await model_id(client),
        messages=conversation()[:1],
        tools=TOOLS,
        temperature=0,
        max_tokens=128,
        stream=True,
    )
    chunks = [c async for c in stream]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "python"
    assert json.loads(calls[0].function.arguments) == {"code": CODE}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_n_2_returns_two_seeded_choices_and_counts_both_in_usage(client):
    model = await model_id(client)
    kw = dict(model=model, messages=[{"role": "user", "content": "Compute"}], temperature=1.0, max_tokens=8)
    r = await client.chat.completions.create(n=2, seed=11, logprobs=True, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    again = await client.chat.completions.create(n=2, seed=11, logprobs=True, **kw)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    # Choice i samples with seed + i: the tokens of a single request with that seed. Checked on a raw prompt
    # outside the over-fitted conversation, where the model is uncertain (after the chat template's assistant
    # turn it starts its tool call whatever the seed, so two choices there are alike on some CPUs' kernels).
    kw = dict(model=model, prompt="Compute", max_tokens=8, temperature=1.0)
    c = await client.completions.create(n=2, seed=3, **kw)
    alone = [(await client.completions.create(n=1, seed=3 + i, **kw)).choices[0].text for i in (0, 1)]
    assert [x.text for x in c.choices] == alone
    assert c.usage.completion_tokens <= 16


@pytest.mark.parametrize("temperature", [1.0, 0.5])
async def test_top_logprobs_are_the_top_of_the_sampled_distribution_checked_against_a_forward_pass(
    client, tool_model, hf, temperature
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model)
    model = await model_id(client)
    messages = [{"role": "user", "content": QUESTION}]
    r = await client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=temperature,
        seed=5,
        max_tokens=6,
        logprobs=True,
        top_logprobs=5,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    out = [int(t.token.removeprefix("token_id:")) for t in content]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt_ids + out])).logits[0, len(prompt_ids) - 1 : -1].float()
    ref = torch.log_softmax(logits / temperature, dim=-1)
    atol = logprob_atol(
        float(logits.abs().max()) / temperature
    )  # tests/float_bounds.py (an over-fitted model)
    for i, entry in enumerate(content):
        got_ids = [int(a.token.removeprefix("token_id:")) for a in entry.top_logprobs]
        got = [a.logprob for a in entry.top_logprobs]
        assert got == sorted(got, reverse=True) and len(set(got_ids)) == 5
        # each is the reference's log-prob of that token, and no token left out beats one listed: the top 5 up
        # to rounding (tokens within atol of each other may trade places)
        assert got == pytest.approx(ref[i, got_ids].tolist(), abs=atol)
        assert float(torch.topk(ref[i], 5).values[-1]) <= got[-1] + 2 * atol
        assert entry.logprob == pytest.approx(ref[i, out[i]].item(), abs=atol)


async def test_completions_logprobs_n_lists_n_alternatives_per_token(client):
    c = await client.completions.create(
        model=await model_id(client),
        prompt="Compute 3",
        max_tokens=4,
        logprobs=3,
        seed=2,
        extra_body={"ignore_eos": True},
    )
    lp = c.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == 4
    for tops, token, value in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs, strict=True):
        assert 1 <= len(tops) <= 3 and sorted(tops.values(), reverse=True) == list(tops.values())
        assert token not in tops or tops[token] == pytest.approx(value)


async def test_unknown_model_is_a_404_in_openais_error_shape(client):
    with pytest.raises(openai.NotFoundError) as e:
        await client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "hi"}])
    err = e.value.body
    assert err["type"] == "not_found_error" and err["param"] == "model" and err["code"] == "model_not_found"
    assert "gpt-nope" in err["message"]


async def test_bad_request_names_the_param_in_one_line(client):
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(
            model=await model_id(client),
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["param"] == "messages.0"
    assert "image_url" in err["message"] and "\n" not in err["message"]


async def test_unknown_fields_are_ignored_with_one_warning_per_field(tool_model, caplog):
    from aiohttp import web

    from agent_rl.engines.api import EngineOptions
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.embedded.server import build_app
    from agent_rl.openai import protocol

    engine = EmbeddedEngine(
        tool_model,
        EngineOptions(max_batch=4, max_seq_len=256),
    )
    runner = web.AppRunner(build_app(engine, str(tool_model), served_model_name="tiny"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    protocol._warned.discard("frobnicate")
    protocol._warned.discard("messages[].mood")
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi", "mood": "happy"}],
        "max_tokens": 2,
        "frobnicate": {"x": 1},
    }
    try:
        with caplog.at_level(logging.WARNING, logger="agent_rl.openai.protocol"):
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    async with s.post(url, json=body) as r:
                        assert r.status == 200, await r.text()
    finally:
        await runner.cleanup()
        await engine.close()
    warned = [rec.getMessage() for rec in caplog.records if "unknown field" in rec.getMessage()]
    assert len(warned) == 2
    assert any("'frobnicate'" in w for w in warned) and any("'messages[].mood'" in w for w in warned)


async def test_sglang_generate_takes_a_batch_n_and_top_logprobs_num(served):
    body = {
        "input_ids": [[20, 21, 22], [30, 31]],
        "sampling_params": {"max_new_tokens": 3, "n": 2, "sampling_seed": 1, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 4,
    }
    async with aiohttp.ClientSession() as s, s.post(served.url + "/generate", json=body) as r:
        assert r.status == 200
        out = await r.json()
    assert len(out) == 4  # prompt-major: p0 s0, p0 s1, p1 s0, p1 s1
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [3, 3, 2, 2]
    for o in out:
        tops = o["meta_info"]["output_top_logprobs"]
        assert len(tops) == 3 and all(len(t) == 4 for t in tops)
        for (lp, _tid, _), top in zip(o["meta_info"]["output_token_logprobs"], tops, strict=True):
            assert top[0][0] >= lp  # the sampled token is at most as likely as the most likely one
            assert all(a[0] >= b[0] for a, b in zip(top, top[1:], strict=False))
    assert len({o["meta_info"]["id"] for o in out}) == 4
