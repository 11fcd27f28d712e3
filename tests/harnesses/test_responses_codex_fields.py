"""What Codex CLI sends to the Responses API, taken as a Responses server should (agent_rl/openai/responses.py).

No harness runs here (this module is in `make test`): the request is the shape Codex CLI 0.171.0 sent to a local
server (MACHINE-NOTES 2026-12-06), abridged: function, namespace and web_search tools, plus reasoning, include,
store, prompt_cache_key and client_metadata.
"""

from __future__ import annotations

import logging

import pytest

from agent_rl.openai import responses
from agent_rl.openai.errors import Invalid, validate


def fn(name: str) -> dict:
    return {
        "type": "function",
        "name": name,
        "description": name,
        "strict": False,
        "parameters": {"type": "object"},
    }


CODEX_BODY = {
    "model": "policy",
    "stream": True,
    "input": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "developer",
            "content": [{"type": "input_text", "text": "rules"}],
        },
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ],
    "tools": [
        fn("exec_command"),
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "sub-agents",
            "tools": [fn("close_agent")],
        },
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a24a51",
    "client_metadata": {"session_id": "01a24a51"},
}


def req(**changes) -> responses.ResponsesReq:
    return validate(responses.ResponsesReq, {**CODEX_BODY, **changes})


def test_codex_request_offers_function_and_namespace_tools_flat_and_leaves_web_search_out(caplog):
    caplog.set_level(logging.WARNING)
    responses._warned_hosted.discard("web_search")
    chat, _ = responses.to_chat(req(), [])
    assert [t.function.name for t in chat.tools] == ["exec_command", "close_agent"]
    assert [r.getMessage() for r in caplog.records].count(
        "responses: tool type 'web_search' is a hosted tool with no runner here: accepted, not offered to the model"
    ) == 1
    responses.to_chat(req(), [])  # one warning per tool type, not per request
    assert sum("web_search" in r.getMessage() for r in caplog.records) == 1


def test_codex_fields_that_do_not_change_sampling_are_declared_not_unknown():
    from agent_rl.openai.protocol import unknown_fields

    assert unknown_fields(req()) == []
    chat_plain, _ = responses.to_chat(
        req(reasoning=None, include=None, store=None, prompt_cache_key=None), []
    )
    chat_codex, _ = responses.to_chat(req(), [])
    assert chat_codex.to_params(64) == chat_plain.to_params(64)  # the same sampling either way


def test_a_call_of_a_namespaced_tool_comes_back_with_its_namespace():
    chat = {
        "created": 0,
        "model": "policy",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "close_agent", "arguments": "{}"}},
                        {"id": "c2", "function": {"name": "exec_command", "arguments": "{}"}},
                    ],
                },
            }
        ],
    }
    out = responses.to_response(req(), chat, "resp_1")["output"]
    assert [(o["name"], o.get("namespace")) for o in out] == [
        ("close_agent", "multi_agent_v1"),
        ("exec_command", None),
    ]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tool_choice": {"type": "web_search"}}, "names a hosted tool"),
        ({"tools": [fn("a"), {"type": "namespace", "name": "n", "tools": [fn("a")]}]}, "['a'] occur twice"),
        (
            {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
            "holds function tools",
        ),
        ({"tools": [{"type": "namespace", "name": "n"}]}, "needs a list of tools"),
        ({"tools": [{"name": "x"}]}, "needs a type"),
    ],
)
def test_tools_a_responses_server_cannot_take_are_a_400_naming_them(change, says):
    with pytest.raises(Invalid, match=says.replace("[", r"\[").replace("]", r"\]")):
        responses.to_chat(req(**change), [])
