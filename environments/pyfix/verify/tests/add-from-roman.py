import pytest
from envkit_check import module, raises

roman = module("kit.roman")


def test_examples():
    assert roman.from_roman("MCMXCIV") == 1994
    assert roman.from_roman("XLII") == 42


def test_round_trip():
    for n in range(1, 4000):
        assert roman.from_roman(roman.to_roman(n)) == n


@pytest.mark.parametrize("bad", ["", "IIII", "VX", "ABC", "MMMM"])
def test_rejects_invalid(bad):
    with raises(ValueError):
        roman.from_roman(bad)
