"""What the gateway records for Anthropic Messages clients (the official `anthropic` SDK, unmodified): the sampled
tokens and log-probs the engine produced, tool results and the system prompt masked, one chain while the client
only appends, a fork when it rewrites an earlier turn or drops a thinking block; and 400s in Anthropic's shape,
naming the field, that record nothing, for malformed requests.

The model is the tool model (tests/tool_model.py), greedy: it answers "Compute 3 * 4" with a python call and the
tool result with "The answer is 12.". The thinking-block test uses a second gateway on the same engine whose
tokenizer carries Qwen3's template (it renders an assistant turn's thinking), tests/anthropic_fronts.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from anthropic_fronts import messages_fronts
from float_bounds import logprob_atol
from tool_model import CODE, FINAL, QUESTION, TOOLS

from agent_rl.gateway.assemble import assemble

anthropic = pytest.importorskip("anthropic")
PYTHON = {
    "name": "python",
    "description": TOOLS[0]["function"]["description"],
    "input_schema": TOOLS[0]["function"]["parameters"],
}
NOOP = {"name": "noop", "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}
SYSTEM = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def fronts(tool_model):
    with messages_fronts(tool_model, max_seq_len=1024, thinking=True) as f:
        yield f


@pytest.fixture(scope="module")
def hf(tool_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tool_model, dtype=torch.float32).eval()


class Opener:
    def __init__(self, fronts):
        self.fronts, self.n = fronts, 0

    def __call__(self, *, thinking: bool = False) -> tuple[str, object]:
        """A fresh gateway session: (its id, an SDK client on it)."""
        self.n += 1
        sid = f"anthropic-{self.n}"
        url = self.fronts.open(sid, thinking=thinking)
        return sid, anthropic.Anthropic(base_url=url, api_key=self.fronts.key, max_retries=0)


@pytest.fixture(scope="module")
def session(fronts):
    return Opener(fronts)


def blocks(message) -> list[dict]:
    """A reply's content as the client sends it back (the SDK's objects dumped, None fields dropped)."""
    return [b.model_dump(exclude_none=True) for b in message.content]


def round_trip(client):
    """The tool call and the final answer, the second request appending to the first (no system prompt: the
    model was trained on the bare question)."""
    first_msgs = [{"role": "user", "content": QUESTION}]
    first = client.messages.create(
        model="policy", max_tokens=128, messages=first_msgs, tools=[PYTHON], extra_body=GREEDY
    )
    (use,) = [b for b in first.content if b.type == "tool_use"]
    second_msgs = [
        *first_msgs,
        {"role": "assistant", "content": blocks(first)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12"}]},
    ]
    second = client.messages.create(
        model="policy", max_tokens=64, messages=second_msgs, tools=[PYTHON], extra_body=GREEDY
    )
    return first, second, second_msgs


def test_recorded_tokens_and_logprobs_are_the_engines_and_tool_results_and_system_are_masked(
    fronts, session, hf, tool_model
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model)
    sid, client = session()
    first, second, _ = round_trip(client)
    assert first.stop_reason == "tool_use" and second.content[0].text == FINAL
    calls = fronts.session(sid).calls
    assert [c.extended for c in calls] == [False, True]
    (traj,), splits = assemble(calls)
    assert splits == 0
    # what was sampled is what the reply says: its usage, its tool call, its text
    assert [len(c.token_ids) for c in calls] == [first.usage.output_tokens, second.usage.output_tokens]
    assert [c.prompt_ids for c in calls][0] == tuple(traj.prompt_ids)
    assert tok.decode(calls[1].token_ids, skip_special_tokens=True) == FINAL
    # the trajectory trains on exactly the engine's tokens and log-probs; everything else is masked
    sampled = [s for s in traj.segments if s.sampled]
    assert [s.token_ids for s in sampled] == [c.token_ids for c in calls]
    assert [s.logprobs for s in sampled] == [c.logprobs for c in calls]
    env = [s for s in traj.segments if not s.sampled]
    assert "<tool_response>\n12\n</tool_response>" in tok.decode([t for s in env for t in s.token_ids])
    # and those log-probs are the model's: a Hugging Face forward over the recorded ids gives the same (greedy:
    # each sampled token is the argmax)
    ids = list(traj.prompt_ids) + [t for s in traj.segments for t in s.token_ids]
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    at = len(traj.prompt_ids)
    for s in traj.segments:
        if s.sampled:
            rows = ref[at - 1 : at - 1 + len(s.token_ids)]
            got = torch.tensor(s.logprobs)
            want = rows[torch.arange(len(s.token_ids)), torch.tensor(s.token_ids)]
            atol = logprob_atol(float(logits.abs().max()))  # tests/float_bounds.py (an over-fitted model)
            assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
            assert rows.argmax(-1).tolist() == list(s.token_ids)
        at += len(s.token_ids)


def test_the_system_prompt_is_in_the_prompt_and_never_trained_on(fronts, session, tool_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model)
    sid, client = session()
    client.messages.create(
        model="policy", max_tokens=8, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
    )
    (traj,), _ = assemble(fronts.session(sid).calls)
    assert tok.decode(traj.prompt_ids).startswith("<|im_start|>system\nYou are terse.")
    assert "You are terse." not in tok.decode([t for s in traj.segments for t in s.token_ids])


def test_a_client_that_appends_stays_one_chain_streamed_or_not(fronts, session):
    sid, client = session()
    first_msgs = [{"role": "user", "content": QUESTION}]
    with client.messages.stream(
        model="policy", max_tokens=128, messages=first_msgs, tools=[PYTHON], extra_body=GREEDY
    ) as s:
        first = s.get_final_message()
    (use,) = [b for b in first.content if b.type == "tool_use"]
    msgs = [
        *first_msgs,
        {"role": "assistant", "content": blocks(first)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12"}]},
    ]
    second = client.messages.create(
        model="policy", max_tokens=64, messages=msgs, tools=[PYTHON], extra_body=GREEDY
    )
    assert second.content[0].text == FINAL
    msgs += [{"role": "assistant", "content": blocks(second)}, {"role": "user", "content": "thanks"}]
    client.messages.create(model="policy", max_tokens=8, messages=msgs, tools=[PYTHON], extra_body=GREEDY)
    calls = fronts.session(sid).calls
    assert [c.extended for c in calls] == [False, True, True]
    assert assemble(calls)[1] == 0


def test_rewriting_an_earlier_turn_forks(fronts, session):
    sid, client = session()
    _, second, msgs = round_trip(client)
    rewritten = json.loads(json.dumps(msgs))
    rewritten[2]["content"][0]["content"] = "13"  # the tool result, rewritten after the fact
    rewritten += [{"role": "assistant", "content": blocks(second)}, {"role": "user", "content": "sure?"}]
    client.messages.create(
        model="policy", max_tokens=8, messages=rewritten, tools=[PYTHON], extra_body=GREEDY
    )
    calls = fronts.session(sid).calls
    # the rewritten request still extends the first call (same question, same tool call echoed), so its prompt is
    # that call's ids + the new suffix; it no longer extends the second call's chain: a second trajectory
    assert [c.extended for c in calls] == [False, True, True]
    (one, two), splits = assemble(calls)
    assert splits == 1 and two.prompt_ids[: len(calls[0].prompt_ids)] == list(calls[0].prompt_ids)


def test_dropping_a_thinking_block_forks_keeping_it_extends(fronts, session):
    """Qwen3's template renders the thinking of the assistant turns after the last user query: a client that
    echoes them continues the chain; one that drops an earlier turn's thinking starts a new one."""
    sid, client = session(thinking=True)
    history = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Run it.", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "noop", "input": {}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
    ]
    forced = {"type": "tool", "name": "noop"}  # a short forced call, so the next turn can answer it
    kw = dict(model="policy", max_tokens=64, tools=[NOOP], tool_choice=forced, extra_body=GREEDY)
    first = client.messages.create(messages=history, **kw)
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.input == {}
    appended = [
        *history,
        {"role": "assistant", "content": blocks(first)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]},
    ]
    client.messages.create(messages=appended, **kw)
    dropped = json.loads(json.dumps(appended))
    del dropped[1]["content"][0]  # the thinking block of the earlier turn
    client.messages.create(messages=dropped, **kw)
    calls = fronts.session(sid).calls
    assert [c.extended for c in calls] == [False, True, False]
    assert assemble(calls)[1] == 1


def test_tool_choice_any_forces_a_call_through_constrained_decoding(fronts, session):
    """After the tool result the model answers in text; `any` makes it call a tool anyway (the chat path's grammar)."""
    sid, client = session()
    _, second, msgs = round_trip(client)
    assert second.stop_reason == "end_turn"
    forced = client.messages.create(
        model="policy",
        max_tokens=128,
        messages=msgs,
        tools=[PYTHON],
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    )
    assert forced.stop_reason == "tool_use" and [b.type for b in forced.content] == ["tool_use"]
    assert fronts.session(sid).calls[-1].constrained


# --- bad input: each a 400 in Anthropic's shape that names the field, never a 500, and records nothing -------

OK_MSG = [{"role": "user", "content": QUESTION}]
CALL = {"type": "tool_use", "id": "toolu_9", "name": "python", "input": {"code": CODE}}
BAD = {
    "empty messages": ({"messages": []}, "messages"),
    "no messages": ({"messages": None}, "messages"),
    "messages not a list": ({"messages": "hi"}, "messages"),
    "no max_tokens": ({"max_tokens": None}, "max_tokens"),
    "max_tokens a string": ({"max_tokens": "ten"}, "max_tokens"),
    "max_tokens zero": ({"max_tokens": 0}, "max_tokens"),
    "max_tokens over the context": ({"max_tokens": 10**9}, "max_tokens"),
    "no model": ({"model": None}, "model"),
    "role tool": ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    "tool_use in a system message": (
        {"messages": [*OK_MSG, {"role": "system", "content": [CALL]}]},
        "messages[1].content[0].type",
    ),
    "content a number": ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    "image block": (
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "messages[0].content[0].type",
    ),
    "unknown block type": (
        {"messages": [{"role": "user", "content": [{"type": "frobnicate"}]}]},
        "messages[0].content[0].type",
    ),
    "unknown field in a block": (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "bold": True}]}]},
        "messages[0].content[0].bold",
    ),
    "tool_result for no tool_use": (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}]},
        "messages[0].content[0].tool_use_id",
    ),
    "tool_use in a user message": (
        {"messages": [{"role": "user", "content": [CALL]}]},
        "messages[0].content[0].type",
    ),
    "tool_use input not an object": (
        {"messages": [*OK_MSG, {"role": "assistant", "content": [{**CALL, "input": "x"}]}, *OK_MSG]},
        "messages[1].content[0].input",
    ),
    "tool_use left unanswered": (
        {"messages": [*OK_MSG, {"role": "assistant", "content": [CALL]}, *OK_MSG]},
        "messages[2].content",
    ),
    "final assistant message": (
        {"messages": [*OK_MSG, {"role": "assistant", "content": "The"}]},
        "messages[1].role",
    ),
    "temperature above 1": ({"temperature": 2}, "temperature"),
    "top_k negative": ({"top_k": -1}, "top_k"),
    "stop_sequences a string": ({"stop_sequences": "x"}, "stop_sequences"),
    "system a number": ({"system": 5}, "system"),
    "tool without input_schema": ({"tools": [{"name": "python"}]}, "tools[0].input_schema"),
    "server tool": ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    "tool_choice names no tool": (
        {"tools": [PYTHON], "tool_choice": {"type": "tool", "name": "bash"}},
        "tool_choice.name",
    ),
    "tool_choice any without tools": ({"tool_choice": {"type": "any"}}, "tool_choice"),
    "thinking budget too small": (
        {"thinking": {"type": "enabled", "budget_tokens": 10}},
        "thinking.budget_tokens",
    ),
    "unsupported sampling field": ({"frequency_penalty": 0.5}, "frequency_penalty"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_request_is_a_400_naming_the_field_and_records_nothing(fronts, session, name):
    patch, field = BAD[name]
    body = {"model": "policy", "max_tokens": 16, "messages": OK_MSG, **patch}
    body = {k: v for k, v in body.items() if v is not None}
    sid, client = session()
    r = httpx.post(
        f"{client.base_url}v1/messages?beta=true",
        json=body,
        headers={"x-api-key": fronts.key, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert field in err["error"]["message"], err["error"]["message"]
    s = fronts.session(sid)
    assert s.calls == [] and s.answered == [] and s.stats.calls == 0 and s.over is None


def test_malformed_json_is_a_400(fronts, session):
    sid, client = session()
    r = httpx.post(f"{client.base_url}v1/messages", content=b"{not json", headers={"x-api-key": fronts.key})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "malformed JSON" in r.json()["error"]["message"]
    assert fronts.session(sid).calls == []


def test_count_tokens_records_nothing_and_refuses_like_messages(fronts, session):
    sid, client = session()
    counted = client.messages.count_tokens(model="policy", messages=OK_MSG, tools=[PYTHON])
    s = fronts.session(sid)
    assert counted.input_tokens > 0 and s.calls == [] and s.stats.calls == 0
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(
            model="policy", messages=[{"role": "user", "content": [{"type": "image"}]}]
        )
    assert "messages[0].content[0].type" in e.value.body["error"]["message"]
    assert s.calls == []
