"""What the gateway records per episode: one `Call` per sampled choice, in the order they were answered."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Call:
    """One choice of one chat completion: the prompt ids the gateway built, and what the engines sampled.

    token_ids / logprobs / versions are exactly the engines' output (continuations after a weight-update
    abort concatenated); `aborts` counts those interruptions; `extended` says the prompt was built as the
    previous call's ids + the rendered suffix (the prefix-extension rule), not by a full re-render."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: str  # "stop" | "length" (after continuations, never "abort")
    aborts: int = 0
    extended: bool = False
    seconds: float = 0.0


@dataclass
class SessionStats:
    calls: int = 0
    sampled_tokens: int = 0
    aborts: int = 0
    extended: int = 0  # prompts built by the prefix-extension rule
    rerendered: int = 0  # prompts rendered in full (first call, or the agent did not only append)
    gen_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
