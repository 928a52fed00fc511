"""Closed integer intervals [start, end]."""

from typing import List, Tuple

Interval = Tuple[int, int]


def merge(intervals: List[Interval]) -> List[Interval]:
    """Merge overlapping or touching intervals; the result is sorted."""
    out: List[Interval] = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total_length(intervals: List[Interval]) -> int:
    return sum(end - start for start, end in merge(intervals))
