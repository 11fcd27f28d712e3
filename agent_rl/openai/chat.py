"""Chat messages to token ids and completions back to OpenAI choices: shared by `agent-rl serve` and the gateway.

- `template_messages` turns OpenAI messages into what Hugging Face chat templates read: text parts
  joined, `developer` as `system`, `null` content as "", tool-call arguments as dicts.
- `render` applies the tokenizer's chat template (with `tools`) and tokenizes the text once.
- `choice` builds one OpenAI choice from sampled ids: the text, tool calls parsed by a
  `tool_parsers` parser (finish_reason "tool_calls"), and log-probs with their top alternatives.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from agent_rl.openai.errors import Invalid
from agent_rl.openai.protocol import ChatMessage, ToolDef
from agent_rl.openai.reasoning import ReasoningParser
from agent_rl.openai.tool_parsers import ParsedOutput

TopList = Sequence[tuple[int, float]]


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
                }
                for c in m.tool_calls
            ]
        out.append(d)
    return out


def _arguments(raw: str) -> Any:
    """Templates (Qwen, Llama, Hermes) expect the arguments as a mapping; keep the string if it is not JSON."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def template_tools(tools: Sequence[ToolDef] | None) -> list[dict] | None:
    if not tools:
        return None
    return [{"type": "function", "function": t.function.model_dump(exclude_none=True)} for t in tools]


def render_text(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None,
    *,
    add_generation_prompt: bool,
    template_kwargs: dict | None = None,
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise Invalid(
            "the tokenizer has no chat template; use /v1/completions with a text prompt", param="messages"
        )
    import jinja2

    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **(template_kwargs or {}),
        )
    except jinja2.TemplateSyntaxError:
        raise  # the template itself is broken: the server's fault (500)
    except jinja2.TemplateError as e:  # raise_exception(...) or an undefined field: the messages' fault
        raise Invalid(f"the chat template refused the messages: {e}", param="messages") from None


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None,
    *,
    add_generation_prompt: bool = True,
    template_kwargs: dict | None = None,
) -> list[int]:
    text = render_text(
        tokenizer,
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        template_kwargs=template_kwargs,
    )
    return encode(tokenizer, text)


def check_context(prompt_tokens: int, max_seq_len: int, param: str = "messages") -> None:
    """A prompt that leaves no room to sample is a 400 `context_length_exceeded`, as OpenAI answers it."""
    if prompt_tokens >= max_seq_len:
        raise Invalid(
            f"the prompt is {prompt_tokens} tokens and the context is {max_seq_len} (at least one token must "
            "be sampled): shorten the messages",
            param=param,
            code="context_length_exceeded",
        )


def token_piece(tokenizer: Any, token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids or tokenizer is None else tokenizer.decode([token])


def logprob_content(
    tokenizer: Any,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopList] | None,
    *,
    as_ids: bool = False,
) -> list[dict]:
    """OpenAI chat `logprobs.content`: one entry per sampled token, each with its top alternatives."""
    content = []
    for i, (t, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        piece = token_piece(tokenizer, t, as_ids)
        alts = []
        for a, alp in tops[i] if tops is not None else ():
            ap = token_piece(tokenizer, a, as_ids)
            alts.append({"token": ap, "logprob": alp, "bytes": list(ap.encode())})
        content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": alts})
    return content


def message(
    text: str,
    parser: Callable[[str], ParsedOutput] | None,
    reasoning: ReasoningParser | None = None,
    finish: str = "stop",
) -> tuple[dict, bool]:
    """The assistant message for a completion text (reasoning split off first, then tool calls parsed from
    the rest); True when it carries tool calls. Complete calls before one that max_tokens cut (`finish`
    "length") are kept and the unfinished one dropped; an unfinished call without the cut is plain text."""
    thought = None
    if reasoning is not None:
        thought, rest = reasoning(text)
        text = rest or ""
    parsed = parser(text) if parser is not None else ParsedOutput(text)
    if parsed.partial is not None and finish != "length":
        parsed = ParsedOutput(text)
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if thought is not None:
        msg["reasoning_content"] = thought
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in parsed.tool_calls
        ]
    elif msg["content"] is None:
        msg["content"] = ""
    return msg, bool(parsed.tool_calls)


def choice(
    index: int,
    text: str,
    finish: str,
    parser: Callable[[str], ParsedOutput] | None,
    logprobs: list[dict] | None,
    stop_reason: int | str | None = None,
    reasoning: ReasoningParser | None = None,
) -> dict:
    msg, has_calls = message(text, parser, reasoning, finish)
    return {
        "index": index,
        "message": msg,
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": "tool_calls" if has_calls and finish == "stop" else finish,
        "stop_reason": stop_reason,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
