"""The prompt ids of a chat request, built so that an agent that only appends messages never forks.

A chat template may render earlier turns differently on the next call (Qwen3 drops the reasoning of
earlier assistant turns, some templates re-format tool calls), so re-rendering the whole conversation
would not extend the previous call's prompt + completion ids and every turn would become a new
trajectory. The rule here: when the new request's messages are an earlier request's messages, then
the assistant message the gateway returned for it, then appended messages, the prompt is

    earlier prompt ids + sampled completion ids + ids of (closing glue + rendered suffix)

where the suffix is rendered after a fixed stand-in conversation (`_BASE`) and cut off after its
stand-in assistant message, and the closing glue is what the template puts after an assistant message
that the sampled ids did not already contain (e.g. "\\n" after a sampled "<|im_end|>"). Sampled ids
are never decoded and re-encoded. Anything else (the agent edited history, dropped or reordered
messages, changed tools) is rendered in full, and trajectory assembly then decides whether it still
extends an earlier call or starts a new trajectory.

Work done once, not per call: the stand-in conversation's rendering per tools/template variables, and
full renders of the same messages (the n episodes of a group open with the same request) come from
small caches keyed by the canonical JSON of what the template sees.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_rl.openai import chat
from envs.codec import codec

_SENTINEL = "GATEWAY-ASSISTANT-SENTINEL-9f3c"
_BASE = [{"role": "user", "content": "GATEWAY-USER-SENTINEL"}, {"role": "assistant", "content": _SENTINEL}]


@dataclass(frozen=True)
class Built:
    """The prompt ids of a request, whether they extend an answered choice, and the request's cache keys."""

    ids: list[int]
    extended: bool
    keys: tuple[str, ...]  # message_key of each message
    context: str  # context_key of tools and template variables


@dataclass(frozen=True)
class Answered:
    """A choice the gateway returned: the conversation it continued, and the assistant message it sent."""

    messages_key: tuple[str, ...]  # canonical JSON of each request message
    tools_key: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    message: dict  # the assistant message as returned (content, tool_calls)


def message_key(m: dict) -> str:
    return json.dumps(m, sort_keys=True, ensure_ascii=False)


def context_key(tools: list[dict] | None, template_kwargs: dict | None) -> str:
    """What else the template sees: a request with other tools or template variables never extends."""
    return json.dumps([tools, template_kwargs], sort_keys=True, ensure_ascii=False)


def same_assistant(sent: dict, returned: dict) -> bool:
    """The agent echoed back the assistant message we returned (content and tool calls; ids and None vs "" aside)."""
    if sent.get("role") != "assistant" or (sent.get("content") or "") != (returned.get("content") or ""):
        return False

    def calls(m: dict) -> list[tuple[str, Any]]:
        out = []
        for c in m.get("tool_calls") or []:
            fn = c["function"]
            args = fn["arguments"]
            if isinstance(args, str):
                with contextlib.suppress(json.JSONDecodeError):
                    args = json.loads(args)
            out.append((fn["name"], json.dumps(args, sort_keys=True)))
        return out

    return calls(sent) == calls(returned)


class PromptBuilder:
    """Renders requests for one tokenizer and template; `build` applies the prefix-extension rule."""

    def __init__(self, tokenizer: Any, cache_size: int = 256):
        self.tok, self.codec = tokenizer, codec(tokenizer)
        self._eos_texts = {
            tokenizer.convert_ids_to_tokens(t)
            for t in ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        }
        self._full: OrderedDict[tuple[str, tuple[str, ...]], tuple[int, ...]] = OrderedDict()  # LRU
        self._cache_size = cache_size

    def build(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict | None,
        answered: Sequence[Answered],
    ) -> tuple[list[int], bool]:
        """(prompt ids, True if built by extension of an answered choice)."""
        b = self.prepare(messages, tools, template_kwargs, answered)
        return b.ids, b.extended

    def prepare(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict | None,
        answered: Sequence[Answered],
    ) -> Built:
        """`build` with the request's cache keys (what the gateway records in `Answered`)."""
        keys = tuple(message_key(m) for m in messages)
        ctx = context_key(tools, template_kwargs)
        for a in reversed(answered):  # the latest matching choice wins
            n = len(a.messages_key)
            if (
                a.tools_key == ctx
                and len(keys) > n + 1
                and keys[:n] == a.messages_key
                and same_assistant(messages[n], a.message)
            ):
                suffix = self.suffix_ids(a.token_ids, messages[n + 1 :], tools, template_kwargs)
                if suffix is not None:
                    return Built([*a.prompt_ids, *a.token_ids, *suffix], True, keys, ctx)
        ids = self._full.get((ctx, keys))
        if ids is None:
            text = chat.render_text(
                self.tok, messages, tools, add_generation_prompt=True, template_kwargs=template_kwargs
            )
            ids = self._full[(ctx, keys)] = tuple(self.codec.encode(text))
            if len(self._full) > self._cache_size:
                self._full.popitem(last=False)
        else:
            self._full.move_to_end((ctx, keys))
        return Built(list(ids), False, keys, ctx)

    def suffix_ids(
        self,
        completion: Sequence[int],
        appended: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict | None,
    ) -> list[int] | None:
        """Ids of the glue after a sampled assistant turn plus the appended messages and generation prompt;
        None when the template does not render the stand-in assistant message exactly once (then render in full).

        The text after the stand-in message in the rendering of (stand-in conversation + appended messages) is
        that glue + suffix. It is cut from that one rendering, not from the difference of two: a template may
        render an assistant turn differently when it is the last message (Qwen3 adds an empty <think> block)."""
        full = chat.render_text(
            self.tok, _BASE + appended, tools, add_generation_prompt=True, template_kwargs=template_kwargs
        )
        at = full.find(_SENTINEL)
        if at < 0 or full.count(_SENTINEL) != 1:
            return None
        rest = full[at + len(_SENTINEL) :]  # e.g. "<|im_end|>\n<|im_start|>user\n<tool_response>..."
        last = self.tok.convert_ids_to_tokens(completion[-1]) if completion else None
        if last in self._eos_texts and rest.startswith(last):
            rest = rest[len(last) :]  # the model sampled the end-of-turn token itself
        return self.codec.encode(rest)
