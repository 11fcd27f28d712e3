from util import is_positive


def test_is_positive():
    assert is_positive(10) is True
