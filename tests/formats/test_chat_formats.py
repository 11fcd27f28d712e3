"""Real chat formats end to end: Qwen3 (<think> reasoning + Hermes <tool_call>) and Llama 3.x (JSON tool calls).

Each family's 2-layer random model (families.py: the real Qwen vocabulary, the family's real template) is
over-fitted to one tool round trip, so greedy decoding through the engine writes the family's real output
format. Through the recording gateway (the official openai client as the agent) the answers carry
`reasoning_content` and `tool_calls` from the configured parsers, and the trajectory keeps the sampled
token ids, reasoning included, exactly as the engine sampled them (loss mask 1, never re-encoded), with
one trajectory for the whole episode (the prefix-extension rule holds under Qwen3's template, which
re-renders earlier turns without their reasoning). `agent-rl serve --tool-parser/--reasoning-parser`
answers the same through its own OpenAI routes.
"""

from __future__ import annotations

import json

import pytest
from families import overfit

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.gateway.assemble import assemble
from agent_rl.gateway.prompt import PromptBuilder
from agent_rl.gateway.server import Gateway
from agent_rl.openai import chat
from agent_rl.openai.reasoning import get_reasoning_parser, parse_qwen3
from agent_rl.openai.tool_parsers import get_parser, parse_llama3_json

openai = pytest.importorskip("openai")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
USER = {"role": "user", "content": "Compute 3 * 4"}
CODE = "print(3 * 4)"
# What each family's model writes (its real format), turn 1 (a tool call) and turn 2 (the answer).
FORMATS = {
    "qwen3": (
        "<think>\nI should run it.\n</think>\n\n"
        '<tool_call>\n{"name": "python", "arguments": {"code": "' + CODE + '"}}\n</tool_call>',
        "<think>\nIt printed 12.\n</think>\n\nThe answer is 12.",
        "hermes",
        "qwen3",
    ),
    "llama": (
        '{"name": "python", "parameters": {"code": "' + CODE + '"}}',
        "The answer is 12.",
        "llama3_json",
        None,
    ),
}


def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def trained(family_dir, tmp_path_factory):
    """family -> the model over-fitted to its round trip, with the prompt ids the gateway will build."""
    out = {}

    def get(family: str):
        if family not in out:
            base = family_dir(family)
            tok = tokenizer(base)
            first, second, *_ = FORMATS[family]
            p1 = chat.render(tok, [USER], TOOLS)
            a1 = chat.encode(tok, first) + [tok.eos_token_id]
            tool = [{"role": "tool", "tool_call_id": "call_0", "content": "12"}]
            glue = PromptBuilder(tok).suffix_ids(a1, tool, TOOLS, None)
            assert glue is not None
            a2 = chat.encode(tok, second) + [tok.eos_token_id]
            ids = p1 + a1 + glue + a2
            mask = [False] * len(p1) + [True] * len(a1) + [False] * len(glue) + [True] * len(a2)
            out[family] = overfit(base, [(ids, mask)], tmp_path_factory.mktemp(f"{family}_tools"))
        return out[family]

    return get


def test_qwen3_template_renders_tools_reasoning_and_drops_earlier_reasoning(family_dir):
    tok = tokenizer(family_dir("qwen3"))
    call = {"id": "c", "type": "function", "function": {"name": "python", "arguments": {"code": CODE}}}
    history = [
        USER,
        {"role": "assistant", "content": "", "reasoning_content": "first thought", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "12"},
    ]
    text = chat.render_text(tok, history, TOOLS, add_generation_prompt=True)
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) in text.replace('", "', '", "')
    # within the current query the reasoning stays; after a new user query it is dropped
    assert "<think>\nfirst thought\n</think>" in text and text.endswith("<|im_start|>assistant\n")
    later = chat.render_text(
        tok, [*history, {"role": "user", "content": "again"}], TOOLS, add_generation_prompt=True
    )
    assert "first thought" not in later
    off = chat.render_text(
        tok, [USER], None, add_generation_prompt=True, template_kwargs={"enable_thinking": False}
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llama3_template_puts_tools_in_the_first_user_turn_and_results_in_ipython(family_dir):
    tok = tokenizer(family_dir("llama"))
    call = {"id": "c", "type": "function", "function": {"name": "python", "arguments": {"code": CODE}}}
    msgs = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "12"},
    ]
    text = chat.render_text(tok, msgs, TOOLS, add_generation_prompt=True)
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    )
    assert '"name": "python"' in text and "Compute 3 * 4<|eot_id|>" in text
    assert '{"name": "python", "parameters": {"code": "print(3 * 4)"}}<|eot_id|>' in text
    assert text.endswith(
        '<|start_header_id|>ipython<|end_header_id|>\n\n"12"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )


def test_parsers_read_each_format_and_leave_the_rest_as_text():
    r, c = parse_qwen3(FORMATS["qwen3"][1])
    assert (r, c) == ("It printed 12.", "The answer is 12.")
    assert parse_qwen3("<think>\ncut off mid-thou") == ("cut off mid-thou", None)
    assert parse_qwen3("no thinking here") == (None, "no thinking here")
    msg, calls = chat.message(FORMATS["qwen3"][0], get_parser("hermes"), get_reasoning_parser("qwen3"))
    assert calls and msg["reasoning_content"] == "I should run it." and msg["content"] is None
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"code": CODE}
    two = parse_llama3_json(
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}'
    )
    assert [c.name for c in two.tool_calls] == ["a", "b"] and two.content is None
    assert json.loads(two.tool_calls[0].arguments) == {"x": 1}
    for text in (
        "The answer is 12.",
        '{"name": "a", "parameters": {}} and then text',
        '{"parameters": {}}',
        "{bad",
    ):
        assert parse_llama3_json(text).tool_calls == () and parse_llama3_json(text).content == text


@pytest.mark.parametrize("family", ["qwen3", "llama"])
async def test_round_trip_through_the_gateway_keeps_the_sampled_tokens(family, trained):
    model_dir = trained(family)
    first, second, tool_parser, reasoning_parser = FORMATS[family]
    tok = tokenizer(model_dir)
    engine = EmbeddedEngine(
        model_dir,
        EngineOptions(max_batch=4, max_seq_len=512),
    )
    gw = Gateway(engine, tok, max_seq_len=512, tool_parser=tool_parser, reasoning_parser=reasoning_parser)
    await gw.start()
    gw.open("ep", sampling=SamplingParams(temperature=0.0))
    client = openai.AsyncOpenAI(base_url=gw.base_url("ep"), api_key="unused", max_retries=0)
    try:
        r1 = (await client.chat.completions.create(model="p", messages=[USER], tools=TOOLS)).choices[0]
        assert r1.finish_reason == "tool_calls", r1
        (call,) = r1.message.tool_calls
        assert call.function.name == "python" and json.loads(call.function.arguments) == {"code": CODE}
        echoed = r1.message.model_dump(exclude_none=True)
        tool = {"role": "tool", "tool_call_id": call.id, "content": "12"}
        r2 = (
            await client.chat.completions.create(model="p", messages=[USER, echoed, tool], tools=TOOLS)
        ).choices[0]
        assert r2.message.content == "The answer is 12." and not r2.message.tool_calls
        if reasoning_parser:
            assert echoed["reasoning_content"] == "I should run it."
            assert r2.message.model_dump()["reasoning_content"] == "It printed 12."
    finally:
        await client.close()
        await gw.close()
        await engine.close()
    calls = gw.close_session("ep").calls
    assert [c.extended for c in calls] == [False, True]  # the second prompt extends the first call's ids
    assert [tok.decode(c.token_ids, skip_special_tokens=False) for c in calls] == [
        first + tok.eos_token,
        second + tok.eos_token,
    ]
    (traj,), splits = assemble(calls)
    assert splits == 0
    sampled = [s for s in traj.segments if s.sampled]
    assert [s.token_ids for s in sampled] == [c.token_ids for c in calls]  # the engine's ids, not re-encoded
    assert [s.logprobs for s in sampled] == [c.logprobs for c in calls]
    flat = traj.flatten()
    if reasoning_parser:  # the reasoning tokens the model sampled are trained on (mask 1)
        think = tok.convert_tokens_to_ids("<think>")
        marks = [m for t, m in zip(flat.input_ids, flat.loss_mask, strict=True) if t == think]
        assert marks == [1, 1]


async def test_serve_returns_reasoning_content_and_tool_calls(trained):
    from aiohttp import web

    from agent_rl.engines.embedded.server import build_app, parse_args

    model_dir = trained("qwen3")
    args = parse_args([str(model_dir), "--tool-parser", "hermes", "--reasoning-parser", "qwen3"])
    engine = EmbeddedEngine(
        model_dir,
        EngineOptions(max_batch=4, max_seq_len=512),
    )
    app = build_app(
        engine, str(model_dir), tool_parser=args.tool_parser, reasoning_parser=args.reasoning_parser
    )
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    try:
        kw = dict(model=str(model_dir), messages=[USER], tools=TOOLS, temperature=0)
        first = (await client.chat.completions.create(**kw)).choices[0]
        assert first.message.model_dump()["reasoning_content"] == "I should run it."
        assert first.message.tool_calls[0].function.name == "python" and first.finish_reason == "tool_calls"
        deltas = [
            c.choices[0].delta.model_dump()
            async for c in await client.chat.completions.create(**kw, stream=True)
            if c.choices
        ]
        assert any(d.get("reasoning_content") == "I should run it." for d in deltas)
        assert any(d.get("tool_calls") for d in deltas)
    finally:
        await client.close()
        await runner.cleanup()
        await engine.close()
