from core import to_minutes


def test_to_minutes():
    assert to_minutes(1) == 60
