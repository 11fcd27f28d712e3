import sys

sys.path.insert(0, "/app")

from util import is_positive  # noqa: E402


def test_is_positive():
    assert is_positive(10) is True
    assert is_positive(-10) is False
    assert is_positive(0) is False
