from values import drop_last


def test_drop_last():
    assert drop_last([1, 2, 3]) == [1, 2]
