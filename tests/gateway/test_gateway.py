"""The recording gateway driven by the official openai client: recording, continuation across a weight update,
token identity, prefix extension, and splitting when an agent rewrites history."""

from __future__ import annotations

import json

import pytest
from recorder import Recorder
from tool_model import CODE, FINAL, TOOLS, conversation

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.gateway.assemble import assemble
from agent_rl.gateway.server import Gateway, SessionLimits

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


async def start(client, tokenizer) -> Gateway:
    gw = Gateway(client, tokenizer, max_seq_len=512)
    await gw.start()
    return gw


def sampled_ids_match(traj, calls) -> None:
    """Every sampled segment is exactly one call's engine output, tokens, log-probs and versions."""
    sampled = [s for s in traj.segments if s.sampled]
    assert [s.token_ids for s in sampled] == [c.token_ids for c in calls]
    assert [s.logprobs for s in sampled] == [c.logprobs for c in calls]
    assert [s.versions for s in sampled] == [c.versions for c in calls]


async def test_function_calling_agent_through_the_gateway_is_recorded_as_one_trajectory(engine, tokenizer):
    rec = Recorder(engine)
    gw = await start(rec, tokenizer)
    session = gw.open("ep-1", sampling=SamplingParams(temperature=0.0))
    client = openai.AsyncOpenAI(base_url=gw.base_url("ep-1"), api_key="unused", max_retries=0)
    try:
        first = await client.chat.completions.create(model="policy", messages=conversation()[:1], tools=TOOLS)
        (call,) = first.choices[0].message.tool_calls
        assert json.loads(call.function.arguments) == {"code": CODE}
        messages = [
            *conversation()[:1],
            first.choices[0].message.model_dump(),
            {"role": "tool", "tool_call_id": call.id, "content": "12"},
        ]
        second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        assert second.choices[0].message.content == FINAL
    finally:
        await client.close()
        await gw.close()
    calls = gw.close_session("ep-1").calls
    assert [c.extended for c in calls] == [False, True] and session.stats.extended == 1
    # the second prompt is the first prompt + the sampled ids + glue and the tool result, ids untouched
    assert calls[1].prompt_ids[: len(calls[0].prompt_ids) + len(calls[0].token_ids)] == (
        calls[0].prompt_ids + calls[0].token_ids
    )
    trajectories, splits = assemble(calls)
    assert splits == 0 and len(trajectories) == 1
    traj = trajectories[0]
    sampled_ids_match(traj, calls)
    assert traj.flatten().input_ids == list(calls[1].prompt_ids + calls[1].token_ids)
    tool_result = tokenizer.decode([t for s in traj.segments if not s.sampled for t in s.token_ids])
    assert "<tool_response>\n12\n</tool_response>" in tool_result
    # token identity: each call's tokens are exactly what the engine returned for its request id
    assert set(rec.returned) == {"ep-1/0.0.0", "ep-1/1.0.0"}
    assert calls[0].token_ids == tuple(rec.returned["ep-1/0.0.0"].token_ids)


async def test_a_weight_update_mid_call_is_continued_and_each_token_keeps_its_version(engine, tokenizer):
    rec = Recorder(engine, when=lambda rid: True, after=4)
    gw = await start(rec, tokenizer)
    gw.open("ep-2", sampling=SamplingParams(temperature=1.0))
    client = openai.AsyncOpenAI(base_url=gw.base_url("ep-2"), api_key="unused", max_retries=0)
    try:
        r = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "Compute"}],
            max_tokens=24,
            logprobs=True,
            extra_body={"ignore_eos": True},
        )
    finally:
        await client.close()
        await gw.close()
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 24  # one ordinary response
    (call,) = gw.close_session("ep-2").calls
    assert rec.updated.is_set() and call.aborts == 1
    assert call.versions[0] == 0 and call.versions[-1] == 1 and sorted(call.versions) == list(call.versions)
    # token identity: the call is the aborted request's output followed by the continuation's
    parts = [rec.returned[k] for k in sorted(rec.returned, key=lambda k: int(k.rsplit(".", 1)[1]))]
    assert len(parts) == 2 and parts[0].finish_reason == "abort"
    assert call.token_ids == tuple(parts[0].token_ids + parts[1].token_ids)
    assert call.logprobs == tuple(parts[0].logprobs + parts[1].logprobs)
    assert call.versions == tuple(parts[0].versions + parts[1].versions)
    assert [c.logprob for c in r.choices[0].logprobs.content] == list(call.logprobs)
    (traj,), _ = assemble([call])
    sampled_ids_match(traj, [call])


async def test_an_agent_that_rewrites_history_splits_into_trajectories_sharing_the_episode(engine, tokenizer):
    gw = await start(engine, tokenizer)
    session = gw.open("ep-3")
    client = openai.AsyncOpenAI(base_url=gw.base_url("ep-3"), api_key="unused", max_retries=0)
    try:
        first = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "Compute 1 + 2"}], max_tokens=6
        )
        # the agent summarises its history instead of appending to it
        await client.chat.completions.create(
            model="p",
            messages=[
                {"role": "user", "content": "Summary of earlier work: " + first.choices[0].message.content},
                {"role": "user", "content": "Go on."},
            ],
            max_tokens=6,
        )
        # then appends to the rewritten conversation: that extends the second trajectory
        await client.chat.completions.create(
            model="p",
            messages=[
                {"role": "user", "content": "Summary of earlier work: " + first.choices[0].message.content},
                {"role": "user", "content": "Go on."},
                {"role": "assistant", "content": "x"},  # not what the model said: rendered in full
                {"role": "user", "content": "More."},
            ],
            max_tokens=6,
        )
    finally:
        await client.close()
        await gw.close()
    calls = gw.close_session("ep-3").calls
    assert session.stats.rerendered == 3
    trajectories, splits = assemble(calls)
    assert splits == len(trajectories) - 1 >= 1
    assert sum(t.num_sampled for t in trajectories) == sum(len(c.token_ids) for c in calls)


async def test_streaming_and_n_2_through_the_gateway_record_one_call_per_choice(engine, tokenizer):
    gw = await start(engine, tokenizer)
    gw.open("ep-4", limits=SessionLimits(max_calls=2))
    client = openai.AsyncOpenAI(base_url=gw.base_url("ep-4"), api_key="unused", max_retries=0)
    try:
        r = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "Compute"}], n=2, max_tokens=5
        )
        stream = await client.chat.completions.create(
            model="p",
            messages=[{"role": "user", "content": "Compute"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        with pytest.raises(openai.APIStatusError, match="call budget") as over:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
    finally:
        await client.close()
        await gw.close()
    calls = gw.close_session("ep-4").calls
    assert over.value.status_code == 410
    assert len(r.choices) == 2 and len(calls) == 3
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokenizer.decode(list(calls[2].token_ids), skip_special_tokens=True)
    assert chunks[-1].usage.completion_tokens == len(calls[2].token_ids)


async def test_a_spent_session_is_final_to_the_sdks_that_retry_conflicts(engine, tokenizer):
    """The OpenAI and Anthropic SDKs retry a 409 (so do the AI SDK and Claude Code's own wrapper, which
    ignores `x-should-retry: false` on one): a spent session answers 410, which no client retries, so an SDK
    allowed three retries sends its refused request once (with a 409 it sent four)."""
    import anthropic
    import httpx
    import httpx2  # what the anthropic SDK speaks

    gw = await start(engine, tokenizer)
    sent: list[str] = []

    async def count(request) -> None:
        sent.append(request.url.path)

    gw.open("spent-openai", limits=SessionLimits(max_calls=1))
    gw.open("spent-anthropic", limits=SessionLimits(max_calls=1))
    oai = openai.AsyncOpenAI(
        base_url=gw.base_url("spent-openai"),
        api_key="unused",
        max_retries=3,
        http_client=httpx.AsyncClient(event_hooks={"request": [count]}),
    )
    ant = anthropic.AsyncAnthropic(
        base_url=gw.base_url("spent-anthropic").removesuffix("/v1"),
        api_key="unused",
        max_retries=3,
        http_client=httpx2.AsyncClient(event_hooks={"request": [count]}),
    )
    msgs = [{"role": "user", "content": "Compute"}]
    try:
        await oai.chat.completions.create(model="p", messages=msgs, max_tokens=2)
        with pytest.raises(openai.APIStatusError, match="call budget") as over:
            await oai.chat.completions.create(model="p", messages=msgs, max_tokens=2)
        await ant.messages.create(model="p", messages=msgs, max_tokens=2)
        with pytest.raises(anthropic.APIStatusError, match="call budget") as ant_over:
            await ant.messages.create(model="p", messages=msgs, max_tokens=2)
    finally:
        await oai.close()
        await ant.close()
        await gw.close()
    assert over.value.status_code == ant_over.value.status_code == 410
    assert (
        sent
        == ["/sessions/spent-openai/v1/chat/completions"] * 2 + ["/sessions/spent-anthropic/v1/messages"] * 2
    )
