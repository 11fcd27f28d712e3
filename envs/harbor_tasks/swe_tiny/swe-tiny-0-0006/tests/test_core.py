import sys

sys.path.insert(0, "/app")

from core import to_fahrenheit  # noqa: E402


def test_to_fahrenheit():
    assert to_fahrenheit(0) == 32
    assert to_fahrenheit(100) == 212
    assert to_fahrenheit(-40) == -40
