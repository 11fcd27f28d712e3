"""A tiny model that answers "Compute 3 * 4" with a Hermes tool call, then "The answer is 12." after the tool result.

Built from the session's random tiny model by over-fitting two conversations with `agent-rl sft`
(a few seconds), with the Hermes tool-calling chat template; greedy decoding reproduces them. Used
by the OpenAI API and gateway tests for a real function-calling round trip through the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

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
QUESTION = "Compute 3 * 4"
CODE = "print(3 * 4)"
FINAL = "The answer is 12."
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "' + CODE + '"}}\n</tool_call>'
SECOND_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(4 * 3)"}}\n</tool_call>'
TWO_CALLS = CALL + "\n" + SECOND_CALL  # one reply with two calls (parallel tool calls)


def conversation(call_id: str = "call_0") -> list[dict]:
    """The full round trip as OpenAI messages: user, assistant tool call, tool result."""
    return [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "python", "arguments": json.dumps({"code": CODE})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "12"},
    ]


def build_tool_model(base: Path, out: Path, steps: int = 150, first_reply: str = CALL) -> Path:
    """Copy `base`, give it the Hermes template, over-fit the two turns (loss on the answers only; the first
    answers the question with `first_reply`); return the dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.openai.templates import HERMES_TOOLS

    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = HERMES_TOOLS
    msgs = conversation()
    rows = []
    for context, answer in ((msgs[:1], first_reply), (msgs, FINAL)):
        prompt = tok.apply_chat_template(context, tools=TOOLS, tokenize=False, add_generation_prompt=True)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((p_ids, a_ids))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (p, a) in enumerate(rows):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
