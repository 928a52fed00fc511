from envkit_check import function

format_cents = function("kit.money.format_cents")


def test_small_negative():
    assert format_cents(-150) == "-$1.50"


def test_large_negative():
    assert format_cents(-123456) == "-$1,234.56"


def test_negative_cents_only():
    assert format_cents(-5) == "-$0.05"
