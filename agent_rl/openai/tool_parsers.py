"""Tool-call parsers: turn a model's completion text into OpenAI `tool_calls`, one parser per model family.

    parsed = get_parser("hermes")(text)      # ParsedOutput(content, tool_calls)

- `hermes` (alias `qwen`) reads the Hermes / Qwen2.5 / Qwen3 format, one call per block:
  `<tool_call>\n{"name": "python", "arguments": {"code": "..."}}\n</tool_call>`. Text before the
  first block is the message content.
- `llama3_json` reads Llama 3.x's JSON calls, as vLLM's parser of that name: the whole output is
  one or more `{"name": ..., "parameters": {...}}` objects (`arguments` is accepted too) separated
  by `;`, optionally after `<|python_tag|>`; there is no content beside them.
- `none` never parses tool calls.
Output that does not parse (bad JSON, no name, an unclosed block, text after the calls) stays plain
text with no tool calls, so the agent sees what the model wrote. One exception: complete calls followed
by one unfinished call come back as those calls with the unfinished text in `partial`; when the reply
was cut by max_tokens (finish_reason "length") the agent gets the complete calls (chat.message),
otherwise the whole text as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: tuple[ParsedCall, ...] = ()
    partial: str | None = None  # an unfinished call after the complete ones (the text from where it starts)


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> ParsedOutput:
    start = text.find("<tool_call>")
    if start < 0:
        return ParsedOutput(text)
    last_close = text.rfind("</tool_call>")
    cut = text.find("<tool_call>", last_close + len("</tool_call>") if last_close >= 0 else start)
    closed = text[start:cut] if cut >= 0 else text[start:]  # the blocks before an unclosed last one
    calls = []
    for body in _HERMES.findall(closed):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return ParsedOutput(text)
        call = _call(obj)  # arguments may come as a JSON string already (some models write them so)
        if call is None:
            return ParsedOutput(text)
        calls.append(call)
    # every opened block before the last one must be closed
    if not calls or closed.count("<tool_call>") != len(calls):
        return ParsedOutput(text)
    content = text[:start].strip()
    return ParsedOutput(content or None, tuple(calls), text[cut:] if cut >= 0 else None)


def _call(obj: object) -> ParsedCall | None:
    """A {"name": str, "arguments" | "parameters": object} dict as a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None


def parse_llama3_json(text: str) -> ParsedOutput:
    body = text.strip()
    body = body.removeprefix("<|python_tag|>").lstrip()
    if not body.startswith("{"):
        return ParsedOutput(text)
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            if (
                calls and body[at] == "{"
            ):  # a last object that does not parse: unfinished if the reply was cut
                return ParsedOutput(None, tuple(calls), body[at:])
            return ParsedOutput(text)
        call = _call(obj)
        if call is None:
            return ParsedOutput(text)
        calls.append(call)
        at = end
        while at < len(body) and body[at] in " \t\n;":
            at += 1
    return ParsedOutput(None, tuple(calls))


def parse_none(text: str) -> ParsedOutput:
    return ParsedOutput(text)


PARSERS: dict[str, Callable[[str], ParsedOutput]] = {
    "hermes": parse_hermes,
    "qwen": parse_hermes,
    "llama3_json": parse_llama3_json,
    "none": parse_none,
}


def get_parser(name: str) -> Callable[[str], ParsedOutput]:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}")
    return PARSERS[name]
