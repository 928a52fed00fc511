from envkit_check import function

median = function("kit.stats.median")


def test_even_length():
    assert median([1, 2, 3, 4]) == 2.5


def test_even_length_unsorted():
    assert median([4, 1, 3, 2]) == 2.5


def test_two_values():
    assert median([1.0, 3.0]) == 2.0
