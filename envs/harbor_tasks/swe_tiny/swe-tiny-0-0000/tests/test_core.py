import sys

sys.path.insert(0, "/app")

from core import to_minutes  # noqa: E402


def test_to_minutes():
    assert to_minutes(1) == 60
    assert to_minutes(0) == 0
    assert to_minutes(39) == 2340
