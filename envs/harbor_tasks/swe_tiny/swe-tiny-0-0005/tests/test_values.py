import sys

sys.path.insert(0, "/app")

from values import area  # noqa: E402


def test_area():
    assert area(18, 3) == 54
    assert area(2, 5) == 10
    assert area(4, 4) == 16
