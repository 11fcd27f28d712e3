"""The SimpleTIR tool protocol: find the code a turn asks to run, and turn tool output into env tokens.

A turn is the model's text up to (and including) the engine's stop string. The first
complete ```python (or ```py) block is run; an unterminated fence is no code at all. The
observation is stdout, or on failure the last line of stderr (SimpleTIR's rule), cut in
the middle to a token budget and wrapped in the observation template. Its tokens are
encoded on their own, never merged with the model's tokens: what the model sampled is
what the learner sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envs.codec import codec
from envs.rewards import last_boxed

# Opening fence at the start of a line (or of the turn), body, closing fence on its own line or after code.
_CODE_RE = re.compile(r"(?:^|\n)[ \t]*```(?:python|py)[ \t]*\n(.*?)\n?[ \t]*```", re.S)


@dataclass(frozen=True)
class ParsedTurn:
    code: str | None
    """Body of the first complete python block; None if there is none (unterminated fences included)."""
    answer: str | None
    """Content of the last \\boxed{} in the turn."""


def parse_turn(text: str) -> ParsedTurn:
    m = _CODE_RE.search(text)
    return ParsedTurn(code=m.group(1) if m else None, answer=last_boxed(text))


def tool_output(
    stdout: str,
    stderr: str,
    exit_code: int | None,
    timed_out: bool,
    oom_killed: bool,
    limit_s: float | None,
    on_error: str,
    empty: str,
) -> str:
    """What the model is shown for one code run."""
    if timed_out:
        where = f" after {limit_s:g} s" if limit_s else ""
        return (
            stdout.rstrip("\n") + "\n" if stdout.strip() else ""
        ) + f"TimeoutError: execution timed out{where}"
    if oom_killed:
        return "MemoryError: the code exceeded the memory limit"
    if exit_code not in (0, None):
        err = stderr.strip()
        if on_error == "last_line":
            err = err.splitlines()[-1] if err else f"exited with status {exit_code}"
        return (stdout.rstrip("\n") + "\n" if stdout.strip() else "") + err
    out = stdout.rstrip("\n")
    return out if out else empty


class ObservationFormatter:
    """Tokenizes `template` around the tool output, cutting the output's tokens in the middle past `max_tokens`."""

    def __init__(self, tokenizer, template: str, max_tokens: int):
        prefix, _, suffix = template.partition("{output}")
        self.codec = codec(tokenizer)
        self.prefix_ids = self.codec.encode(prefix) if prefix else []
        self.suffix_ids = self.codec.encode(suffix) if suffix else []
        self.max_tokens = max_tokens

    def encode(self, output: str) -> list[int]:
        ids = self.codec.encode(output) if output else []
        if len(ids) > self.max_tokens:
            marker = self.codec.encode(f"\n... ({len(ids)} tokens, middle cut) ...\n")
            keep = max(self.max_tokens - len(marker), 2)
            ids = ids[: keep // 2] + marker + ids[len(ids) - (keep - keep // 2) :]
        return self.prefix_ids + ids + self.suffix_ids

    def overhead(self) -> int:
        return len(self.prefix_ids) + len(self.suffix_ids)
