import sys

sys.path.insert(0, "/app")

from tools import with_tax  # noqa: E402


def test_with_tax():
    assert with_tax(100) == 107
    assert with_tax(0) == 0
    assert with_tax(200) == 214
