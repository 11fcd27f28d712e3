"""A Messages request as the chat request it is equivalent to (agent_rl/openai/anthropic.py), and a chat completion as
the Message and event stream it answers with (anthropic_reply.py): pure functions, no engine."""

from __future__ import annotations

import json

import pytest

from agent_rl.openai import anthropic as am
from agent_rl.openai import anthropic_reply as reply
from agent_rl.openai.errors import Invalid

TOOL = {"name": "python", "input_schema": {"type": "object", "properties": {"code": {"type": "string"}}}}
CACHE = {"type": "ephemeral"}


def chat(body: dict, max_seq_len: int = 4096):
    base = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    return am.to_chat(am.parse(am.MessagesReq, {**base, **body}), max_seq_len)


def dumped(req) -> list[dict]:
    return [m.model_dump(exclude_none=True, exclude_unset=True) for m in req.messages]


def test_a_claude_code_shaped_request_is_accepted_and_its_ignored_fields_change_nothing():
    """System as cached blocks, tools with cache_control, metadata, thinking with a budget, context_management,
    service_tier, output_config.effort: what Claude Code sends. Dropping every ignored field gives the same chat."""
    body = {
        "system": [
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "Be brief.", "cache_control": CACHE},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CACHE}]}],
        "tools": [{**TOOL, "cache_control": CACHE}, {**TOOL, "name": "Deferred", "defer_loading": True}],
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "max_tokens": 2000,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "service_tier": "auto",
        "output_config": {"effort": "high"},
        "stream": True,
    }
    got = chat(body)
    bare = json.loads(json.dumps(body))
    for k in ("metadata", "context_management", "service_tier", "output_config"):
        del bare[k]
    del bare["system"][1]["cache_control"], bare["messages"][0]["content"][0]["cache_control"]
    del bare["tools"][0]["cache_control"], bare["tools"][1]
    assert got.model_dump() == chat(bare).model_dump()
    assert dumped(got) == [
        {"role": "system", "content": "You are Claude Code.\nBe brief."},
        {"role": "user", "content": "hi"},
    ]
    assert got.chat_template_kwargs == {"enable_thinking": True}
    assert got.tools[0].function.parameters == TOOL["input_schema"] and got.max_tokens == 2000


def test_a_system_message_among_the_messages_is_a_system_turn_in_place():
    """Claude Code sends its environment as a system-role message after the first user turn."""
    got = chat(
        {
            "system": "top",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": CACHE}]},
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "# Env"}, {"type": "text", "text": "cwd"}],
                },
            ],
            "thinking": {"type": "adaptive", "display": "omitted"},
        }
    )
    assert dumped(got) == [
        {"role": "system", "content": "top"},
        {"role": "user", "content": "q"},
        {"role": "system", "content": "# Env\ncwd"},
    ]


def test_tool_use_thinking_and_tool_results_become_the_chat_turns():
    got = chat(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "Let me run it."},
                        {"type": "tool_use", "id": "t1", "name": "python", "input": {"code": "1"}},
                        {"type": "tool_use", "id": "t2", "name": "python", "input": {"code": "ü"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "1"}],
                        },
                        {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
                        {"type": "text", "text": "go on"},
                    ],
                },
            ]
        }
    )
    assert dumped(got) == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Let me run it.",
            "reasoning_content": "hmm",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "python", "arguments": '{"code": "1"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "python", "arguments": '{"code": "ü"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "1"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
        {"role": "user", "content": "go on"},
    ]


@pytest.mark.parametrize(
    ("choice", "want", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "any"}, "required", None),
        ({"type": "tool", "name": "python"}, {"type": "function", "function": {"name": "python"}}, None),
        ({"type": "none"}, "none", None),
    ],
)
def test_tool_choice(choice, want, parallel):
    got = chat({"tools": [TOOL], "tool_choice": choice})
    assert got.tool_choice == want and got.parallel_tool_calls is parallel


@pytest.mark.parametrize(
    ("thinking", "enabled"),
    [
        (None, False),
        ({"type": "disabled"}, False),
        ({"type": "adaptive"}, True),
        ({"type": "enabled", "budget_tokens": 1024}, True),
    ],
)
def test_thinking_switches_the_templates_thinking(thinking, enabled):
    body = {"max_tokens": 2000} if thinking is None else {"max_tokens": 2000, "thinking": thinking}
    assert chat(body).chat_template_kwargs == {"enable_thinking": enabled}


def test_sampling_and_structured_output_carry_over():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = chat(
        {
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "stop_sequences": ["END"],
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
    )
    p = got.to_params(1)
    assert (p.temperature, p.top_p, p.top_k, p.stop, p.max_new_tokens) == (0.5, 0.9, 20, ("END",), 100)
    assert got.response_format == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def test_count_tokens_request_takes_no_sampling_fields():
    req = am.parse(am.CountTokensReq, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert am.to_chat(req, 8).max_tokens is None
    with pytest.raises(Invalid, match="max_tokens"):
        am.parse(
            am.CountTokensReq, {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
        )


def completion(message: dict, finish: str = "stop", pieces: list[str] | None = None, matched=None) -> dict:
    lps = None if pieces is None else {"content": [{"token": p} for p in pieces]}
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": finish,
        "logprobs": lps,
        "stop_reason": matched,
    }
    usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    return {"id": "x", "created": 0, "model": "m", "choices": [choice], "usage": usage}


def req(**kw):
    return am.parse(
        am.MessagesReq, {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "q"}], **kw}
    )


def test_reply_blocks_and_stop_reasons():
    call = {
        "id": "call_abc",
        "type": "function",
        "function": {"name": "python", "arguments": '{"code": "1"}'},
    }
    msg = reply.message(
        req(),
        completion(
            {"role": "assistant", "content": "ok", "reasoning_content": "think", "tool_calls": [call]}
        ),
    )
    assert msg["content"] == [
        {"type": "thinking", "thinking": "think", "signature": ""},
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "toolu_abc", "name": "python", "input": {"code": "1"}},
    ]
    assert msg["stop_reason"] == "tool_use" and msg["usage"]["input_tokens"] == 7
    text = {"role": "assistant", "content": "The"}
    assert reply.message(req(), completion(text))["stop_reason"] == "end_turn"
    assert reply.message(req(), completion(text, "length"))["stop_reason"] == "max_tokens"
    cut = reply.message(req(stop_sequences=["xx", " an"]), completion(text, matched=" an"))
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", " an")
    eos = reply.message(req(stop_sequences=["!"]), completion(text, matched=2))  # a stop token id: EOS
    assert eos["stop_reason"] == "end_turn"
    # the gateway names the match from the sampled text: the first stop sequence in it
    assert reply.first_stop("The answer is 12.", ["12", " is", "zz"]) == " is"
    assert reply.first_stop("The answer", ["zz"]) is None


def test_events_of_a_thinking_text_reply_and_an_empty_one():
    msg = reply.message(
        req(), completion({"role": "assistant", "content": "ok", "reasoning_content": "think"})
    )
    ev = reply.events(msg)
    assert [(n, d.get("delta", {}).get("type")) for n, d in ev] == [
        ("message_start", None),
        ("content_block_start", None),
        ("ping", None),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert [d["index"] for n, d in ev if n.startswith("content_block")] == [0, 0, 0, 0, 1, 1, 1]
    empty = reply.message(req(), completion({"role": "assistant", "content": ""}))
    assert [n for n, _ in reply.events(empty)] == ["message_start", "ping", "message_delta", "message_stop"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"), (404, "not_found_error"),
     (409, "invalid_request_error"), (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
     (502, "api_error"), (529, "overloaded_error")],
)  # fmt: skip
def test_error_types_by_status(status, kind):
    assert reply.error_body(status, "m") == {"type": "error", "error": {"type": kind, "message": "m"}}
