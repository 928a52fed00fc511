"""Descriptive statistics over sequences of numbers."""

from typing import Sequence


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean() of an empty sequence")
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    """The middle value; the mean of the two middle values for even lengths."""
    if not values:
        raise ValueError("median() of an empty sequence")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid] + ordered[mid + 1]) / 2


def variance(values: Sequence[float]) -> float:
    """Population variance."""
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
