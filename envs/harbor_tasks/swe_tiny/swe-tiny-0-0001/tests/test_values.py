import sys

sys.path.insert(0, "/app")

from values import drop_last  # noqa: E402


def test_drop_last():
    assert drop_last([1, 2, 3]) == [1, 2]
    assert drop_last([5]) == []
    assert drop_last(list(range(14))) == list(range(13))
