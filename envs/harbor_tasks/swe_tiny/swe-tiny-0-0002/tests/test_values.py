import sys

sys.path.insert(0, "/app")

from values import is_positive  # noqa: E402


def test_is_positive():
    assert is_positive(32) is True
    assert is_positive(-32) is False
    assert is_positive(0) is False
