"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): the request, checked, and the
chat-completions request it is equivalent to. The reply, its events and the routes are in anthropic_reply.py.

A Messages request becomes exactly the chat request an OpenAI client would send for the same conversation,
so it renders through the model's chat template the same way and the gateway's prefix-extension rule and
recorder (gateway/prompt.py, assemble.py) apply unchanged:

| Messages | chat completions |
|---|---|
| `system` (a string, or text blocks joined with "\\n") | a first `system` message |
| user `text` blocks (joined) | a `user` message |
| a `system` message among the messages (Claude Code sends one; text blocks joined with "\\n") | a `system` message there |
| user `tool_result` block (string or text blocks; `is_error` prefixes "Error: ") | a `tool` message |
| assistant `thinking` blocks (joined) | `reasoning_content` |
| assistant `text` blocks / `tool_use` blocks | `content` / `tool_calls` (input as JSON arguments) |
| assistant `redacted_thinking` | dropped (opaque: nothing to render) |
| `tools` (`input_schema`, `strict`; one with `defer_loading` is left out, as Anthropic leaves it out of the context) | function tools (`parameters`, `strict`) |
| `tool_choice` auto / any / tool / none (`disable_parallel_tool_use`) | auto / required / a named function / none (`parallel_tool_calls`) |
| `thinking` enabled or adaptive / disabled or absent | `chat_template_kwargs.enable_thinking` true / false |
| `output_config.format` json_schema | `response_format` json_schema |
| `max_tokens`, `temperature`, `top_p`, `top_k`, `stop_sequences` | the same sampling |

Checked as Anthropic checks them, each failure a 400 naming the field: unknown fields and block types,
a `tool_result` that answers no `tool_use` of the assistant message before it, a `tool_use` left
unanswered, an empty `messages` list, a final assistant message (prefill: not supported), a
`max_tokens` above the model's context, a thinking budget under 1024 or not below `max_tokens`.
Accepted and ignored, because they do not change what is sampled here: `cache_control` (anywhere),
`metadata`, `context_management`, `container`, `service_tier`, `inference_geo`, `speed`, `diagnostics`,
`user_profile_id`, `workspace_id`, `output_config.effort` (open models have no effort setting) and the
thinking budget (checked, not enforced: `max_tokens` bounds the whole reply). `mcp_servers`, server tools
and non-text blocks (image, document, ...) would change what the model sees and are refused.

Hand-written rather than a library: the conversion is the point (it decides what is rendered and so what is
trained on), and it is a table.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_rl.openai.errors import ClientError, Invalid
from agent_rl.openai.protocol import ChatReq

BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
ERROR_PREFIX = "Error: "  # a tool_result with is_error: its content, so prefixed, is the tool turn


class Strict(BaseModel):
    """Anthropic refuses fields it does not know; so do we (the ignored ones are declared)."""

    model_config = ConfigDict(extra="forbid")


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: dict | None = None
    citations: list | None = None  # echoed back by clients that dump the response's blocks


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: dict | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str
    cache_control: dict | None = None


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict
    cache_control: dict | None = None
    caller: dict | None = None
    toolset_name: str | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] | None = None
    is_error: bool = False
    cache_control: dict | None = None
    toolset_name: str | None = None

    @property
    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or ())
        return ERROR_PREFIX + body if self.is_error else body


Block = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


class Message(Strict):
    role: Literal["user", "assistant", "system"]  # system: Claude Code sends one after its first user turn
    content: str | list[Block]

    @property
    def blocks(self) -> list:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class Tool(Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict
    type: Literal["custom"] | None = None
    strict: bool | None = None
    cache_control: dict | None = None
    defer_loading: bool | None = (
        None  # Claude Code's tool search: left out of the prompt, as Anthropic leaves it
    )

    @model_validator(mode="after")
    def _object(self):
        if self.input_schema.get("type") != "object":
            raise ValueError(
                f"input_schema must be a JSON schema of type 'object', got {self.input_schema!r}"
            )
        return self


class ChoiceAuto(Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ChoiceAny(Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ChoiceTool(Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ChoiceNone(Strict):
    type: Literal["none"]


ToolChoice = Annotated[ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone, Field(discriminator="type")]


class ThinkingEnabled(Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


class JsonFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # ignored (module docstring)
    format: JsonFormat | None = None


class CountTokensReq(Strict):
    """`POST /v1/messages/count_tokens`: what is rendered (the prompt), no sampling."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # accepted and ignored: they do not change what is sampled here
    cache_control: dict | None = None
    context_management: dict | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_kinds(cls, data: Any) -> Any:
        """Block and tool types named by index before pydantic's union errors (which name no index)."""
        if not isinstance(data, dict):
            return data
        for i, m in enumerate(data.get("messages") if isinstance(data.get("messages"), list) else ()):
            content = m.get("content") if isinstance(m, dict) else None
            for j, b in enumerate(content if isinstance(content, list) else ()):
                kind = b.get("type") if isinstance(b, dict) else None
                if kind not in BLOCKS:
                    raise Invalid(
                        f"messages[{i}].content[{j}].type: block type {kind!r} is not supported "
                        f"(this model reads {', '.join(BLOCKS)})",
                        param=f"messages[{i}].content[{j}].type",
                    )
        for i, t in enumerate(data.get("tools") if isinstance(data.get("tools"), list) else ()):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind not in (None, "custom"):
                raise Invalid(
                    f"tools[{i}].type: tool type {kind!r} is not supported (custom tools with an input_schema "
                    "only: server tools run at Anthropic)",
                    param=f"tools[{i}].type",
                )
        if "mcp_servers" in data:
            raise Invalid("mcp_servers is not supported (list the tools in `tools`)", param="mcp_servers")
        return data


class MessagesReq(CountTokensReq):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict | None = None
    service_tier: str | None = None
    container: str | dict | None = None
    inference_geo: str | None = None
    diagnostics: dict | None = None

    @model_validator(mode="after")
    def _budget(self):
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise Invalid(
                f"thinking.budget_tokens: {self.thinking.budget_tokens} must be less than max_tokens "
                f"({self.max_tokens})",
                param="thinking.budget_tokens",
            )
        if any(not s for s in self.stop_sequences or ()):
            raise Invalid("stop_sequences: an empty stop sequence matches everywhere", param="stop_sequences")
        return self


def parse(model: type[CountTokensReq], data: Any) -> Any:
    """`model` from a JSON body; a body that does not fit is `Invalid` naming the field as Anthropic writes it
    (`messages[0].content[1].input`), union members and tags left out."""
    if not isinstance(data, dict):
        raise Invalid(f"request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        cause = (errs[0].get("ctx") or {}).get("error")
        if isinstance(cause, ClientError):  # a validator that names the field itself
            raise cause from None
        # a union member that failed at its root (`content.str` for a list) says less than one that failed inside
        inner = [x for x in errs if x["loc"] and not _member(x["loc"][-1])]
        err = (inner or errs)[0]
        where = field_path(err["loc"], data)
        got = repr(err.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        raise Invalid(f"{where}: {err['msg']} (got {got})", param=where) from None


_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none", "is-instance", "function-after"}


def _member(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in _TYPE_NAMES)


def field_path(loc: tuple, data: Any) -> str:
    """pydantic's error location as the request's own path: a part that is not a key of the data there is a
    union member (`str`, `list[...]`) or a tagged union's tag and is left out; a missing field is kept."""
    out, node = "", data
    for k, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
        elif isinstance(node, dict) and node.get("type") == part and k < len(loc) - 1:
            continue  # the tag of a tagged union (the block's type), not a field
        elif isinstance(node, dict) and part in node:
            out += f".{part}" if out else part
            node = node[part]
        elif k == len(loc) - 1 and not _member(part):
            out += f".{part}" if out else part  # a required field the request left out
    return out or "body"


def to_chat(req: CountTokensReq, max_seq_len: int) -> ChatReq:
    """The chat request equivalent to `req` (module docstring); `max_seq_len` bounds `max_tokens`."""
    messages = chat_messages(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    k: v
                    for k, v in (
                        ("name", t.name),
                        ("description", t.description),
                        ("parameters", t.input_schema),
                        ("strict", t.strict),
                    )
                    if v is not None
                },
            }
            for t in req.tools
            if not t.defer_loading
        ]
    choice = req.tool_choice
    names = [t.name for t in req.tools or ()]
    if isinstance(choice, ChoiceAny | ChoiceTool) and not names:
        raise Invalid(f"tool_choice: {choice.type!r} needs tools", param="tool_choice.type")
    if isinstance(choice, ChoiceTool) and choice.name not in names:
        raise Invalid(
            f"tool_choice.name: {choice.name!r} is none of the tools {names}", param="tool_choice.name"
        )
    if choice is not None:
        body["tool_choice"] = {
            "auto": "auto",
            "any": "required",
            "none": "none",
            "tool": {"type": "function", "function": {"name": getattr(choice, "name", None)}},
        }[choice.type]
        if getattr(choice, "disable_parallel_tool_use", None):
            body["parallel_tool_calls"] = False
    enabled = req.thinking is not None and req.thinking.type != "disabled"
    body["chat_template_kwargs"] = {"enable_thinking": enabled}
    if req.output_config is not None and req.output_config.format is not None:
        fmt = req.output_config.format
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.schema_},
        }
    if isinstance(req, MessagesReq):
        if req.max_tokens > max_seq_len:
            raise Invalid(
                f"max_tokens: {req.max_tokens} is more than the model's context ({max_seq_len} tokens); send at "
                f"most {max_seq_len} (Claude Code: CLAUDE_CODE_MAX_OUTPUT_TOKENS)",
                param="max_tokens",
            )
        body["max_tokens"] = req.max_tokens
        for name, value in (
            ("temperature", req.temperature),
            ("top_p", req.top_p),
            ("top_k", req.top_k),
            ("stop", req.stop_sequences),
        ):
            if value is not None:
                body[name] = value
    from agent_rl.openai.errors import validate

    return validate(ChatReq, body)


def chat_messages(req: CountTokensReq) -> list[dict]:
    """The conversation as chat messages, checked for tool_use / tool_result pairing as Anthropic checks it."""
    out: list[dict] = []
    if req.system:
        text = req.system if isinstance(req.system, str) else "\n".join(b.text for b in req.system)
        out.append({"role": "system", "content": text})
    if req.messages[-1].role == "assistant":
        raise Invalid(
            f"messages[{len(req.messages) - 1}].role: a final assistant message (prefill) is not supported; end "
            "with a user message",
            param=f"messages[{len(req.messages) - 1}].role",
        )
    open_calls: dict[str, str] = {}  # tool_use ids of the last assistant message not answered yet
    for i, m in enumerate(req.messages):
        if m.role == "system":  # in place, as a chat system message (the template renders it where it is)
            out.append({"role": "system", "content": _system_text(m, i)})
            continue
        if m.role == "assistant":
            if open_calls:
                _unanswered(open_calls, i)
            out.append(_assistant(m, i))
            open_calls = {c["id"]: c["function"]["name"] for c in out[-1].get("tool_calls", ())}
            continue
        text: list[str] = []
        answered: set[str] = set()
        for j, b in enumerate(m.blocks):
            where = f"messages[{i}].content[{j}]"
            if b.type == "tool_result":
                if b.tool_use_id not in open_calls:
                    raise Invalid(
                        f"{where}.tool_use_id: {b.tool_use_id!r} answers no tool_use of the assistant message "
                        f"before it (its tool_use ids: {sorted(open_calls)})",
                        param=f"{where}.tool_use_id",
                    )
                if text:  # text before a tool result: its own user turn, in order
                    out.append({"role": "user", "content": "".join(text)})
                    text = []
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text})
                answered.add(b.tool_use_id)
            elif b.type == "text":
                text.append(b.text)
            else:
                raise Invalid(
                    f"{where}.type: a user message cannot hold a {b.type!r} block", param=f"{where}.type"
                )
        if text:
            out.append({"role": "user", "content": "".join(text)})
        if open_calls and answered != set(open_calls):
            _unanswered({k: v for k, v in open_calls.items() if k not in answered}, i)
        open_calls = {}
    return out


def _system_text(m: Message, i: int) -> str:
    for j, b in enumerate(m.blocks):
        if b.type != "text":
            where = f"messages[{i}].content[{j}].type"
            raise Invalid(f"{where}: a system message holds text blocks only, not {b.type!r}", param=where)
    return "\n".join(b.text for b in m.blocks)


def _unanswered(calls: dict[str, str], i: int) -> None:
    raise Invalid(
        f"messages[{i}].content: tool_use ids {sorted(calls)} have no tool_result in the message after them (each "
        "tool_use needs its tool_result block in the next user message)",
        param=f"messages[{i}].content",
    )


def _assistant(m: Message, i: int) -> dict:
    text, thought, calls = [], [], []
    for j, b in enumerate(m.blocks):
        if b.type == "text":
            text.append(b.text)
        elif b.type == "thinking":
            thought.append(b.thinking)
        elif b.type == "tool_use":
            args = json.dumps(b.input, ensure_ascii=False)
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": args}})
        elif b.type == "tool_result":
            where = f"messages[{i}].content[{j}].type"
            raise Invalid(f"{where}: an assistant message cannot hold a tool_result block", param=where)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if thought:
        msg["reasoning_content"] = "".join(thought)
    if calls:
        ids = [c["id"] for c in calls]
        if len(set(ids)) != len(ids):
            raise Invalid(
                f"messages[{i}].content: tool_use ids repeat: {ids}", param=f"messages[{i}].content"
            )
        msg["tool_calls"] = calls
    return msg
