"""The prefix-extension rule against a template that re-renders earlier turns, trajectory assembly, tool parsing."""

from __future__ import annotations

import json

import pytest
from tool_model import TOOLS

from agent_rl.gateway.assemble import assemble
from agent_rl.gateway.prompt import Answered, PromptBuilder, context_key, message_key
from agent_rl.gateway.record import Call
from agent_rl.openai import chat
from agent_rl.openai.templates import HERMES_TOOLS
from agent_rl.openai.tool_parsers import parse_hermes

# Like Qwen3: an earlier assistant turn is re-rendered without its <think>...</think> reasoning.
STRIPS_REASONING = HERMES_TOOLS.replace(
    "{{ '<|im_start|>assistant\\n' + (m.content or '') }}",
    "{{ '<|im_start|>assistant\\n' + (m.content or '').split('</think>')[-1].lstrip('\\n') }}",
)


@pytest.fixture
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(tiny_model_dir)
    t.chat_template = STRIPS_REASONING
    return t


def sampled(tok, text: str) -> tuple[int, ...]:
    """Stand-in for engine output: ids of `text` followed by the end-of-turn token the model samples."""
    return tuple(chat.encode(tok, text)) + (tok.eos_token_id,)


def turn(tok, text: str, k: int) -> str:
    return f"<think>step {k}: run it</think>\n" + text


class FakeAgent:
    """Appends the gateway's answer and a tool result each turn, like an ordinary tool loop."""

    def __init__(self, tok, rule: bool):
        self.tok, self.rule = tok, rule
        self.builder = PromptBuilder(tok)
        self.messages = [{"role": "user", "content": "Compute 3 * 4"}]
        self.answered: list[Answered] = []
        self.calls: list[Call] = []

    def step(self, k: int) -> None:
        msgs = self.messages
        tools = [{"type": "function", "function": t["function"]} for t in TOOLS]
        if self.rule:
            ids, extended = self.builder.build(msgs, tools, None, self.answered)
        else:
            ids, extended = chat.render(self.tok, msgs, tools), False
        text = turn(
            self.tok,
            '<tool_call>\n{"name": "python", "arguments": {"code": "print(3 * 4)"}}\n</tool_call>',
            k,
        )
        out = sampled(self.tok, text)
        self.calls.append(
            Call(tuple(ids), out, (-0.5,) * len(out), (k,) * len(out), "stop", extended=extended)
        )
        message, _ = chat.message(text, parse_hermes)
        keys = tuple(message_key(m) for m in msgs)
        self.answered.append(Answered(keys, context_key(tools, None), tuple(ids), out, message))
        call_id = f"call_{k}"
        echoed = {
            "role": "assistant",
            "content": message["content"],
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "python", "arguments": {"code": "print(3 * 4)"}},
                }
            ],
        }
        self.messages = [*self.messages, echoed, {"role": "tool", "tool_call_id": call_id, "content": "12"}]


def test_template_that_strips_earlier_reasoning_forks_every_turn_when_re_rendered(tok):
    agent = FakeAgent(tok, rule=False)
    for k in range(4):
        agent.step(k)
    trajectories, splits = assemble(agent.calls)
    assert splits == 3 and len(trajectories) == 4  # what peers report: n rollouts become n * turns samples


def test_prefix_extension_rule_keeps_an_append_only_agent_in_one_trajectory(tok):
    agent = FakeAgent(tok, rule=True)
    for k in range(4):
        agent.step(k)
    assert [c.extended for c in agent.calls] == [False, True, True, True]
    trajectories, splits = assemble(agent.calls)
    assert splits == 0 and len(trajectories) == 1
    traj = trajectories[0]
    assert [s.token_ids for s in traj.segments if s.sampled] == [c.token_ids for c in agent.calls]
    assert [s.versions for s in traj.segments if s.sampled] == [c.versions for c in agent.calls]
    # the reasoning the model sampled stays in the trajectory the learner trains on
    assert tok.decode(traj.flatten().input_ids).count("<think>") == 4
    # the in-between env tokens are exactly the glue + tool result the template renders for the suffix
    glue = tok.decode(list(traj.segments[1].token_ids))
    assert (
        glue == "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_calls_that_extend_are_joined_with_the_in_between_tokens_masked() -> None:
    a = Call((1, 2), (3, 4), (-0.1, -0.2), (0, 0), "stop")
    b = Call((1, 2, 3, 4, 9, 9), (5,), (-0.3,), (1,), "stop")
    (traj,), splits = assemble([a, b])
    flat = traj.flatten()
    assert splits == 0
    assert flat.input_ids == [1, 2, 3, 4, 9, 9, 5]
    assert flat.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert flat.versions == [-1, -1, 0, 0, -1, -1, 1]


def test_a_prompt_that_extends_no_earlier_call_starts_a_new_trajectory_and_counts_a_split() -> None:
    a = Call((1, 2), (3,), (-0.1,), (0,), "stop")
    b = Call((7, 2, 3, 8), (5,), (-0.3,), (0,), "stop")  # history edited: first token differs
    c = Call((1, 2, 3, 6), (4,), (-0.2,), (1,), "stop")  # continues the first trajectory again
    trajectories, splits = assemble([a, b, c])
    assert splits == 1 and len(trajectories) == 2
    assert trajectories[0].flatten().input_ids == [1, 2, 3, 6, 4]
    assert trajectories[1].prompt_ids == [7, 2, 3, 8] and trajectories[1].uid.endswith(".1")


def test_hermes_parser_reads_calls_and_leaves_unparseable_output_as_text() -> None:
    ok = parse_hermes(
        'Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'
    )
    assert ok.content == "Let me run it." and ok.tool_calls[0].name == "python"
    assert json.loads(ok.tool_calls[0].arguments) == {"code": "1"}
    two = parse_hermes(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert [c.name for c in two.tool_calls] == ["a", "b"] and json.loads(two.tool_calls[1].arguments) == {
        "x": 1
    }
    for bad in (
        '<tool_call>{"name": "a", "arguments": {}</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "a", "arguments": {}}',  # never closed
    ):
        out = parse_hermes(bad)
        assert out.tool_calls == () and out.content == bad
    # complete calls before one cut off: kept, the unfinished one reported apart (chat.message keeps them only
    # when max_tokens cut the reply)
    cut = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b"'
    out = parse_hermes(cut)
    assert (
        [c.name for c in out.tool_calls] == ["a"]
        and out.partial == '<tool_call>{"name": "b"'
        and out.content is None
    )


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_a_call_cut_by_max_tokens_leaves_the_complete_calls_and_finish_reason_length(parser) -> None:
    from agent_rl.openai.tool_parsers import get_parser

    first = {
        "hermes": '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n',
        "llama3_json": '{"name": "a", "parameters": {"x": 1}}; ',
    }[parser]
    cut = first + {"hermes": '<tool_call>{"name": "b", "argu', "llama3_json": '{"name": "b", "param'}[parser]
    length = chat.choice(0, cut, "length", get_parser(parser), None)
    assert length["finish_reason"] == "length"
    assert [c["function"]["name"] for c in length["message"]["tool_calls"]] == ["a"]
    assert json.loads(length["message"]["tool_calls"][0]["function"]["arguments"]) == {"x": 1}
    # an unfinished call the budget did not cut (the model stopped there) is no call: the text, as before
    stop = chat.choice(0, cut, "stop", get_parser(parser), None)
    assert stop["finish_reason"] == "stop" and "tool_calls" not in stop["message"]
    assert stop["message"]["content"] == cut
