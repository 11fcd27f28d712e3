"""Shared fixtures: a tiny real Hugging Face model directory built offline once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen2ForCausalLM (hidden 128, untied embeddings) and its BPE tokenizer, saved to disk."""
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    return build_tiny(tmp_path_factory.mktemp("tiny_model"), sample_corpus(), vocab_size=512, seed=0)


@pytest.fixture(scope="session")
def tool_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model over-fitted to one Hermes function-calling round trip (tests/tool_model.py)."""
    import torch
    from tool_model import build_tool_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_tool_model(tiny_model_dir, tmp_path_factory.mktemp("tool_model"))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """$AGENT_RL_DATA if set (as envs.spec.default_data_root reads it: a git worktree has no ../shared beside it),
    else ../shared/data beside the checkout (the data sets with their SOURCE.txt)."""
    import os

    path = Path(os.environ["AGENT_RL_DATA"]) if os.environ.get("AGENT_RL_DATA") else SHARED / "data"
    if not path.is_dir():
        pytest.skip(
            f"{path} not found: the tests expect ../shared beside the checkout (or AGENT_RL_DATA set)"
        )
    return path


RANK_MODULES = [
    "torch",
    "transformers",
    "megatron.core",
    "agent_rl.learners._torch_rank",
    "agent_rl.learners.megatron.rank",
]
"""What a learner rank imports (a module that is not installed is skipped). From a fork server that preloads them,
one launch of a Megatron rank step took 2.2 s instead of 12-14 s (docs/tests.md, fifteenth session)."""


@pytest.fixture(scope="module")
def ranks_from_a_fork_server():
    """Learner ranks (agent_rl.learners._processes pools, and the tests' own `spawn_ranks`) start, for this module,
    as children of a fork server that has imported RANK_MODULES once, not as fresh interpreters.

    The ranks' code and arguments are the same either way (pickled to the child). What differs: the child holds
    the modules the server imported, and the server's environment (from when it started), not the test's at the
    launch. Not on a machine with a GPU: an import there may initialise CUDA, which a forked child cannot use, so
    ranks start fresh as in production. Modules that do not ask for this keep the production start (spawn):
    tests/learners/test_learner_build.py and the DP tests among them."""
    import torch

    from agent_rl.learners import _processes

    if torch.cuda.is_available():
        yield
        return
    torch.multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_MODULES)  # no-op once it runs
    with pytest.MonkeyPatch.context() as mp:  # module scope: the function-scoped `monkeypatch` cannot serve
        mp.setattr(_processes, "START_METHOD", "forkserver")
        yield
