"""Harness tests need the pinned harnesses (`make test-harnesses` installs them into .harnesses/ first)."""

from __future__ import annotations

import pytest

from envs.harness import HARNESSES


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("harness") and not (HARNESSES / ".installed").exists():
            item.add_marker(
                pytest.mark.skip(reason="the harnesses are not installed: run `make test-harnesses`")
            )


@pytest.fixture(scope="session")
def mini_model(tmp_path_factory):
    """The tiny model over-fitted to mini-swe-agent's session (tests/harnesses/drive.py `learn`) and its base dir."""
    import asyncio

    from drive import learn
    from exchanges import MINI

    base = tmp_path_factory.mktemp("mini")
    return asyncio.run(learn(MINI, base / "model", base)), base
