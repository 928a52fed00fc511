"""Calendar helpers."""

import datetime as dt


def add_business_days(start: dt.date, days: int) -> dt.date:
    """The date ``days`` business days (Mon-Fri) after ``start``."""
    current = start
    remaining = days
    while remaining > 0:
        current += dt.timedelta(days=1)
        remaining -= 1
    return current


def is_weekend(day: dt.date) -> bool:
    return day.weekday() >= 5
