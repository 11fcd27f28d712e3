from values import is_positive


def test_is_positive():
    assert is_positive(32) is True
