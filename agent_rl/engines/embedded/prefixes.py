"""The running requests' prompts, indexed by block, so a new request copies the keys of the longest prefix it
shares with one of them instead of prefilling it again.

A GRPO group sends the same prompt n times at once, and every agent turn starts with the same system prompt:
on agent_arith 64 % of the tokens the engine prefilled were a prompt another running request had just
prefilled (counted by hand; benchmarks/engine_fork.py measures what copying them saves a training step). The index is vLLM's automatic prefix caching reduced to
what a slot cache needs: each prompt is cut into BLOCK-token blocks, block i keyed by a hash chained over
blocks 0..i (so a key names the whole prefix up to it), and a lookup walks the new prompt's keys until one is
missing, then extends the match token by token inside the next block. A hit is checked against the source's
tokens before it is used (a hash collision can cost a copy, never wrong keys).

Hand-written (a dict of chained hashes) rather than a radix tree library: the scheduler needs one lookup per
admitted request and one insert/remove per request, all on the engine thread.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

BLOCK = 16


class Prompted(Protocol):
    """What the index keeps: a request's prompt and its `block_keys` (scheduler.Request)."""

    prompt: list[int]
    blocks: list[int]


R = TypeVar("R", bound=Prompted)


def block_keys(tokens: list[int]) -> list[int]:
    """One key per full BLOCK of `tokens`: key i names tokens[: (i + 1) * BLOCK]."""
    keys, h = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h = hash((h, *tokens[end - BLOCK : end]))
        keys.append(h)
    return keys


class PrefixIndex(Generic[R]):
    """Requests whose prompt keys are in the cache at the current weights, by prompt block."""

    def __init__(self) -> None:
        self._by_key: dict[int, dict[R, None]] = {}  # an insertion-ordered set per key

    def __len__(self) -> int:  # blocks indexed (0: no request's prompt held)
        return len(self._by_key)

    def add(self, req: R) -> None:
        for k in req.blocks:
            self._by_key.setdefault(k, {})[req] = None

    def remove(self, req: R) -> None:
        for k in req.blocks:
            held = self._by_key.get(k)
            if held is not None:
                held.pop(req, None)
                if not held:
                    del self._by_key[k]

    def clear(self) -> None:
        self._by_key.clear()

    def find(self, prompt: list[int], keys: list[int]) -> tuple[R | None, int]:
        """The indexed request sharing the longest prefix with `prompt` (whose block keys are `keys`), and how
        many leading tokens they share; (None, 0) when no full block is shared."""
        source, n = None, 0
        for i, k in enumerate(keys):
            held = self._by_key.get(k)
            if not held:
                break
            source, n = next(iter(held)), (i + 1) * BLOCK
        if source is None or source.prompt[:n] != prompt[:n]:  # a hash collision: prefill it all
            return None, 0
        end = min(len(prompt), len(source.prompt))
        while n < end and prompt[n] == source.prompt[n]:
            n += 1
        return source, n
