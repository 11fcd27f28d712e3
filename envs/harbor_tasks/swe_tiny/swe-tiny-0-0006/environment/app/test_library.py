from library import with_discount


def test_with_discount():
    assert with_discount(100) == 79
