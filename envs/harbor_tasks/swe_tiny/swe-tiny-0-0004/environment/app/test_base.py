from base import count_up


def test_count_up():
    assert count_up(3) == [1, 2, 3]
