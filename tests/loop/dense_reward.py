"""A dense reward for loop tests: a random tiny model gets varied rewards, so the policy really changes."""

from __future__ import annotations

from typing import Any


def digit_share(text: str, task: Any) -> float:
    """Share of digits in the response (0..1): differs between samples, unlike 0/1 correctness at random init."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)
