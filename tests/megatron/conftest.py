"""Every Megatron test module starts its ranks from a fork server (tests/conftest.py `ranks_from_a_fork_server`):
dozens of launches of one or two rank processes would otherwise each import megatron-core anew."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _megatron_ranks_from_a_fork_server(ranks_from_a_fork_server):
    yield
