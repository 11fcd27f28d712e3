import sys

sys.path.insert(0, "/app")

from util import is_adult  # noqa: E402


def test_is_adult():
    assert is_adult(13) is True
    assert is_adult(12) is False
    assert is_adult(33) is True
