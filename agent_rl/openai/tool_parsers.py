"""Tool-call parsers: turn a model's completion text into OpenAI `tool_calls`, one parser per model family.

    parsed = PARSERS["hermes"](text)      # ParsedOutput(content, tool_calls)

`hermes` reads the Hermes / Qwen2.5 / Qwen3 format, one call per block:
`<tool_call>\n{"name": "python", "arguments": {"code": "..."}}\n</tool_call>`. Text before the
first block is the message content. Output that does not parse (bad JSON, no name, an unclosed
block) stays plain text with no tool calls, so the agent sees what the model wrote. `none` never
parses tool calls.
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


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> ParsedOutput:
    start = text.find("<tool_call>")
    if start < 0:
        return ParsedOutput(text)
    calls = []
    for body in _HERMES.findall(text[start:]):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return ParsedOutput(text)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ParsedOutput(text)
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string already
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return ParsedOutput(text)
        if not isinstance(args, dict):
            return ParsedOutput(text)
        calls.append(ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False)))
    # every opened block must be closed: an unclosed one means the model was cut off mid-call
    if not calls or text.count("<tool_call>") != len(calls):
        return ParsedOutput(text)
    content = text[:start].strip()
    return ParsedOutput(content or None, tuple(calls))


def parse_none(text: str) -> ParsedOutput:
    return ParsedOutput(text)


PARSERS: dict[str, Callable[[str], ParsedOutput]] = {"hermes": parse_hermes, "none": parse_none}


def get_parser(name: str) -> Callable[[str], ParsedOutput]:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}")
    return PARSERS[name]
