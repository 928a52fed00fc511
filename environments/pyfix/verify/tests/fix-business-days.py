import datetime as dt

from envkit_check import function

add_business_days = function("kit.dates.add_business_days")


def test_friday_plus_one_is_monday():
    assert add_business_days(dt.date(2024, 1, 5), 1) == dt.date(2024, 1, 8)


def test_full_week():
    assert add_business_days(dt.date(2024, 1, 3), 5) == dt.date(2024, 1, 10)


def test_from_saturday():
    assert add_business_days(dt.date(2024, 1, 6), 1) == dt.date(2024, 1, 8)


def test_long_span():
    assert add_business_days(dt.date(2024, 1, 1), 20) == dt.date(2024, 1, 29)
