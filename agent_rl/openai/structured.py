"""OpenAI's structured-output options as an engine `Constraint`: `response_format`, `tool_choice`,
`parallel_tool_calls` and `strict` function tools, enforced by grammar-constrained sampling.

What is enforced (tool calls in the format of the `hermes` parser and its alias `qwen`, Hermes / Qwen2.5 /
Qwen3: `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, calls separated by a newline;
other parsers take `tool_choice: "auto"` without strict tools and no `response_format` beside tools):

| request | constraint |
|---|---|
| `response_format` json_schema / json_object | `json_schema` (json_object: any JSON object) |
| `tool_choice: "required"` | `ebnf`: one or more calls of the given tools (exactly one if `parallel_tool_calls: false`) |
| `tool_choice: {"type": "function", "function": {"name": N}}` | `ebnf`: exactly one call of N |
| `tool_choice: "auto"` + `response_format` | `ebnf`: the JSON answer, or calls |
| `tool_choice: "auto"`, a tool with `strict: true` | `structural_tag`: free text; after `<tool_call>` a call of a known tool |
| `tool_choice: "auto"`, `parallel_tool_calls: false` | stop after the first `</tool_call>` |

Under a forced call, ARGS match the tool's `parameters` schema whether or not it is strict (a call
that does not parse is of no use to the agent); under "auto", only strict tools' ARGS are checked.
The grammars are written with xgrammar (a core dependency, imported here when a request needs one). A schema
the client sent that xgrammar cannot compile is the request's mistake (400 naming the field).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent_rl.engines.api import Constraint
from agent_rl.openai.errors import Invalid
from agent_rl.openai.protocol import ChatReq, ToolDef
from agent_rl.openai.tool_parsers import get_parser, parse_hermes

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_PARALLEL = 8  # calls one forced response may hold when parallel_tool_calls is not false


@dataclass(frozen=True)
class Structure:
    constraint: Constraint | None = None
    stop: tuple[str, ...] = ()  # stop strings kept in the output (the closing tag of the one allowed call)


def response_schema(response_format: dict | None) -> dict | None:
    """The JSON schema a response_format asks for; None for text."""
    if response_format is None or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise Invalid("response_format json_schema needs a json_schema object", param="response_format")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise Invalid(
                f"response_format.json_schema.schema must be an object, got {schema!r}",
                param="response_format",
            )
        return schema
    raise Invalid(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
        param="response_format",
    )


def for_chat(req: ChatReq, parser: str) -> Structure:
    """The constraint and extra stops of a chat request under tool parser `parser` (see the table above)."""
    out = _for_chat(req, parser)
    if out.constraint is not None and req.ignore_eos:
        raise Invalid(
            "ignore_eos cannot be combined with response_format, tool_choice or strict tools (the grammar "
            "ends at EOS)",
            param="ignore_eos",
        )
    return out


def _for_chat(req: ChatReq, parser: str) -> Structure:
    schema = response_schema(req.response_format)
    tools = req.tools or []
    choice = req.tool_choice
    single = req.parallel_tool_calls is False
    if not tools or choice == "none":
        if isinstance(choice, dict) or choice == "required":
            raise Invalid(f"tool_choice {choice!r} needs tools", param="tool_choice")
        return Structure(None if schema is None else Constraint("json_schema", _dumps(schema)))
    if get_parser(parser) is not parse_hermes:  # hermes and its alias qwen: the format the grammar writes
        if choice not in (None, "auto") or schema is not None or any(t.function.strict for t in tools):
            raise Invalid(
                f"tool_choice {choice!r}, strict tools and response_format with tools need a tool-call "
                f"format to enforce; this server's tool parser is {parser!r} (use hermes or qwen)",
                param="tool_choice",
            )
        return Structure()
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        named = [t for t in tools if t.function.name == name]
        if choice.get("type") != "function" or not named:
            raise Invalid(
                f"tool_choice {choice!r}: name one of the tools {[t.function.name for t in tools]} as "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        return Structure(Constraint("ebnf", calls_ebnf(named, single=True, strict_only=False)))
    if choice == "required":
        return Structure(Constraint("ebnf", calls_ebnf(tools, single=single, strict_only=False)))
    stop = (CALL_CLOSE,) if single else ()
    if schema is not None:
        xgr = _xgr()
        with _client_schema("response_format"):
            answer = xgr.Grammar.from_json_schema(_dumps(schema), any_whitespace=False)
        calls = xgr.Grammar.from_ebnf(calls_ebnf(tools, single=single, strict_only=True))
        return Structure(Constraint("ebnf", str(xgr.Grammar.union(answer, calls))), stop)
    if any(t.function.strict for t in tools):
        tag = {
            "type": "structural_tag",
            "structures": [
                {"begin": _call_head(t), "schema": _args_schema(t, strict_only=True), "end": _call_tail()}
                for t in tools
            ],
            "triggers": [CALL_OPEN],
        }
        return Structure(Constraint("structural_tag", _dumps(tag)), stop)
    return Structure(None, stop)


def calls_ebnf(tools: list[ToolDef], *, single: bool, strict_only: bool) -> str:
    """xgrammar EBNF of one call of any of `tools` (or up to MAX_PARALLEL, newline-separated), then the end."""
    xgr = _xgr()

    def lit(text: str) -> Any:
        return xgr.Grammar.from_ebnf("root ::= " + json.dumps(text, ensure_ascii=False))

    def args(t: ToolDef) -> Any:
        with _client_schema(f"tools[{t.function.name}].function.parameters"):
            return xgr.Grammar.from_json_schema(_dumps(_args_schema(t, strict_only)), any_whitespace=False)

    one = xgr.Grammar.union(
        *(xgr.Grammar.concat(lit(_call_head(t)), args(t), lit(_call_tail())) for t in tools)
    )
    text = str(one)
    if single:
        return text
    head, _, rest = text.partition("\n")
    if not head.startswith("root ::=") or re.search(r"\broot\b", rest):
        return text  # the root rule is referenced inside (a recursive schema): one call only
    return (
        f'root ::= agentrl_call ("\\n" agentrl_call){{0,{MAX_PARALLEL - 1}}}\n'
        + head.replace("root ::=", "agentrl_call ::=", 1)
        + "\n"
        + rest
    )


def _call_head(t: ToolDef) -> str:
    return f'{CALL_OPEN}\n{{"name": {json.dumps(t.function.name, ensure_ascii=False)}, "arguments": '


def _call_tail() -> str:
    return "}\n" + CALL_CLOSE


def _args_schema(t: ToolDef, strict_only: bool) -> dict:
    params = t.function.parameters
    if params is None or (strict_only and not t.function.strict):
        return {"type": "object"}
    return params


def _dumps(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def _xgr() -> Any:
    import xgrammar  # a core dependency; imported on the first request that needs a grammar

    return xgrammar


@contextmanager
def _client_schema(param: str) -> Iterator[None]:
    """xgrammar refusing a JSON schema the client sent (RuntimeError, or ValueError / TypeError on its shape) is
    the request's mistake: a 400 naming `param`."""
    try:
        yield
    except (RuntimeError, ValueError, TypeError) as e:
        raise Invalid(f"{param}: the JSON schema does not compile to a grammar: {e}", param=param) from None
