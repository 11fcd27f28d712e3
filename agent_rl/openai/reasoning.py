"""Reasoning parsers: split a completion into `reasoning_content` and the answer, one parser per model family.

    reasoning, content = get_reasoning_parser("qwen3")(text)

`qwen3` (also right for QwQ and DeepSeek-R1-style `<think>` output): the text before `</think>` (after
an optional leading `<think>`) is the reasoning, the text after it the content, both without the
newlines the template puts around them. Output that opened `<think>` and never closed it (cut off
mid-thought) is all reasoning; output without `</think>` otherwise is all content (thinking was off).
The parse concerns only what the agent reads: the trajectory keeps the sampled token ids, reasoning
included, as they were sampled.
"""

from __future__ import annotations

from collections.abc import Callable

ReasoningParser = Callable[[str], tuple[str | None, str | None]]


def parse_qwen3(text: str) -> tuple[str | None, str | None]:
    head, end, tail = text.partition("</think>")
    if not end:
        body = text.lstrip()
        return (
            (body.removeprefix("<think>").strip("\n"), None) if body.startswith("<think>") else (None, text)
        )
    reasoning = head.split("<think>", 1)[-1].strip("\n")
    return reasoning, tail.lstrip("\n") or None


REASONING_PARSERS: dict[str, ReasoningParser] = {"qwen3": parse_qwen3}


def get_reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The parser called `name`; None (or "none") means no reasoning parsing."""
    if name is None or name == "none":
        return None
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of {sorted(REASONING_PARSERS)} or none"
        )
    return REASONING_PARSERS[name]
