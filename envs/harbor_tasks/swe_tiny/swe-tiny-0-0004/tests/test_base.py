import sys

sys.path.insert(0, "/app")

from base import count_up  # noqa: E402


def test_count_up():
    assert count_up(3) == [1, 2, 3]
    assert count_up(1) == [1]
    assert count_up(25) == list(range(1, 26))
