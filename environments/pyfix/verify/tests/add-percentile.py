import pytest
from envkit_check import module, raises

stats = module("kit.stats")


def test_median_percentile():
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5


def test_interpolates():
    assert stats.percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)


def test_extremes():
    assert stats.percentile([3, 1, 2], 0) == 1
    assert stats.percentile([3, 1, 2], 100) == 3


def test_rejects_bad_input():
    with raises(ValueError):
        stats.percentile([], 50)
    with raises(ValueError):
        stats.percentile([1, 2], 101)
