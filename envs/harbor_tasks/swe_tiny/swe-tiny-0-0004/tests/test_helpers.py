import sys

sys.path.insert(0, "/app")

from helpers import last_index  # noqa: E402


def test_last_index():
    assert last_index(list(range(8))) == 7
    assert last_index(['a']) == 0
    assert last_index([5, 6, 7]) == 2
