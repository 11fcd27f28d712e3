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
