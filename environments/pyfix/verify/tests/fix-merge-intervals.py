from envkit_check import function

merge = function("kit.intervals.merge")


def test_touching_pair():
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]


def test_touching_unsorted():
    assert merge([(5, 6), (1, 5)]) == [(1, 6)]


def test_touching_chain():
    assert merge([(3, 4), (1, 2), (2, 3)]) == [(1, 4)]
