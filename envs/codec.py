"""Text <-> token ids on the hot path: the Rust `tokenizers` backend called directly, same ids and text as
the Hugging Face tokenizer's `encode(text, add_special_tokens=False)` and `decode(ids, ...)`.

The transformers wrapper around a fast tokenizer (argument checks, batching, BatchEncoding, per-token
conversion) costs more than encoding a short tool output itself: ~40 against ~25 us per encode and ~8
against ~3 us per decode here (benchmarks/orchestration.py). `codec(tokenizer)` keeps its own copy of
the backend, so the padding or truncation another caller sets on the shared tokenizer never applies
here; slow (Python) tokenizers, and decoding with clean-up of tokenization spaces, go through the
tokenizer itself.
"""

from __future__ import annotations

import weakref
from typing import Any

_CODECS: weakref.WeakKeyDictionary[Any, Codec] = weakref.WeakKeyDictionary()


class Codec:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = None
        if backend is not None:
            from tokenizers import Tokenizer

            self._backend = Tokenizer.from_str(backend.to_str())
            self._backend.no_padding()
            self._backend.no_truncation()
            self._backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
        self._plain_decode = self._backend is not None and not getattr(
            tokenizer, "clean_up_tokenization_spaces", False
        )

    def encode(self, text: str) -> list[int]:
        if self._backend is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int] | tuple[int, ...], *, skip_special_tokens: bool = False) -> str:
        if not self._plain_decode:
            return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)  # type: ignore[union-attr]


def codec(tokenizer: Any) -> Codec:
    """The codec of `tokenizer` (made once per tokenizer object)."""
    c = _CODECS.get(tokenizer)
    if c is None:
        c = _CODECS[tokenizer] = Codec(tokenizer)
    return c
