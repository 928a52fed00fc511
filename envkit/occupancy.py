"""A counter over time (episodes running, requests in flight, sandboxes alive) that answers
window questions afterwards: its integral, and how long it sat below a level."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable

__all__ = ["Occupancy"]


class Occupancy:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.times: list[float] = [clock()]
        self.counts: list[int] = [0]

    @property
    def value(self) -> int:
        return self.counts[-1]

    def add(self, delta: int) -> None:
        with self.lock:
            now = self.clock()
            count = self.counts[-1] + delta
            if now <= self.times[-1]:  # same instant: the later count wins
                self.counts[-1] = count
            else:
                self.times.append(now)
                self.counts.append(count)

    def add_span(self, t0: float, t1: float, delta: int = 1) -> None:
        """Count ``delta`` over [t0, t1] after the fact (events reported by another process,
        already converted to this clock); later counts shift with it."""
        if t1 <= t0:
            return
        with self.lock:
            for t, d in ((t0, delta), (t1, -delta)):
                i = bisect.bisect_right(self.times, t)
                if i > 0 and self.times[i - 1] == t:
                    start = i - 1
                else:
                    self.times.insert(i, t)
                    self.counts.insert(i, self.counts[i - 1] if i > 0 else 0)
                    start = i
                for j in range(start, len(self.counts)):
                    self.counts[j] += d

    def _segments(self, t0: float, t1: float) -> list[tuple[float, int]]:
        """(duration, count) pieces covering [t0, t1]."""
        with self.lock:
            times, counts = list(self.times), list(self.counts)
        out = []
        i = max(0, bisect.bisect_right(times, t0) - 1)
        while i < len(times) and times[i] < t1:
            start = max(t0, times[i])
            end = min(t1, times[i + 1]) if i + 1 < len(times) else t1
            if end > start:
                out.append((end - start, counts[i]))
            i += 1
        return out

    def integral(self, t0: float, t1: float) -> float:
        """∫ count dt over [t0, t1] (e.g. slot-seconds used)."""
        return sum(d * c for d, c in self._segments(t0, t1))

    def time_below(self, t0: float, t1: float, level: int) -> float:
        """Seconds in [t0, t1] during which the count was below ``level``."""
        return sum(d for d, c in self._segments(t0, t1) if c < level)

    def forget_before(self, t: float) -> None:
        """Drop history older than ``t`` (keeps memory flat over a long run)."""
        with self.lock:
            i = max(0, bisect.bisect_right(self.times, t) - 1)
            del self.times[:i]
            del self.counts[:i]
