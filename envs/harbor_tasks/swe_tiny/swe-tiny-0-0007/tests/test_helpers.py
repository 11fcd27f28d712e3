import sys

sys.path.insert(0, "/app")

from helpers import range_sum  # noqa: E402


def test_range_sum():
    assert range_sum(1, 9) == 45
    assert range_sum(3, 3) == 3
    assert range_sum(0, 4) == 10
