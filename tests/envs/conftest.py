"""Fixtures for the envs tests: a real byte-level BPE tokenizer trained offline, and a local sandbox."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest
import pytest_asyncio

ENV_DIR = Path(__file__).resolve().parents[2] / "envs"


@pytest.fixture(scope="session")
def tok():
    """Tokenizer trained on tiny_arith traces plus generic SimpleTIR text (digits split, chat template set)."""
    from agent_rl.tools.tiny import sample_corpus, train_tokenizer
    from envs import tiny_arith

    return train_tokenizer(tiny_arith.corpus(400) + sample_corpus(), vocab_size=400)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox():
    """A real local (bubblewrap) sandbox shared by a module's tests (which run on one module-wide loop)."""
    import sandboxes

    sb = sandboxes.create("local", pool_size=2)
    yield sb
    try:
        await asyncio.wait_for(sb.close(), 10)
    except TimeoutError:  # a sandboxes bug, not an envs one: say so instead of hanging the suite
        warnings.warn("sandboxes: local sandbox close() did not finish in 10 s", stacklevel=1)
