from values import area


def test_area():
    assert area(18, 3) == 54
