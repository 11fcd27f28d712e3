import sys

sys.path.insert(0, "/app")

from calc import mean  # noqa: E402


def test_mean():
    assert mean([6, 8]) == 7
    assert mean([2, 4, 6]) == 4
    assert mean([5]) == 5
