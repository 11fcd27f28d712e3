import sys

sys.path.insert(0, "/app")

from library import with_discount  # noqa: E402


def test_with_discount():
    assert with_discount(100) == 79
    assert with_discount(0) == 0
    assert with_discount(200) == 158
