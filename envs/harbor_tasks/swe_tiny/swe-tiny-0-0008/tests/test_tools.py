import sys

sys.path.insert(0, "/app")

from tools import difference  # noqa: E402


def test_difference():
    assert difference(14, 4) == 10
    assert difference(3, 1) == 2
    assert difference(0, 5) == -5
