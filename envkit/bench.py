"""`envkit bench sandbox`: cold start, warm acquire, exec round trip and reset, over N runs.

* cold start: create + start a container until a first command has run in it
* warm acquire: take a ready sandbox from a full warm pool (liveness check included)
* exec round trip: one trivial command through the full exec path (wrapper, limits, caps)
* reset: restore the seeded state and compute its hash (informational)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from envkit.runtime import EnvRuntime
from envkit.sandbox.pool import WarmPool

__all__ = ["BenchRow", "bench_sandbox", "percentile", "TARGETS"]

TARGETS = {"cold_start": ("p50", 0.5), "warm_acquire": ("p50", 0.020), "exec": ("p50", 0.080)}


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass
class BenchRow:
    metric: str
    n: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    target: str
    passed: bool | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(metric: str, samples: list[float]) -> BenchRow:
    p50, p90 = percentile(samples, 50), percentile(samples, 90)
    target, passed = "", None
    if metric in TARGETS:
        which, limit = TARGETS[metric]
        value = p50 if which == "p50" else p90
        target = f"{which} <= {limit * 1000:g} ms"
        passed = value <= limit
    return BenchRow(metric, len(samples), round(p50 * 1000, 2), round(p90 * 1000, 2),
                    round(statistics.fmean(samples) * 1000, 2), target, passed)


def bench_sandbox(runtime: EnvRuntime, *, n: int = 50, pool_size: int = 4,
                  tick: Callable[[str], None] | None = None) -> tuple[list[BenchRow], dict[str, Any]]:
    """Returns the table's rows and context (pool hits, sizes, image)."""
    backend = runtime.backend
    note = tick or (lambda _m: None)

    cold: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = backend.create()
        sb.exec("true")
        cold.append(time.perf_counter() - t0)
        sb.destroy()
        note("cold_start")

    sb = backend.create()
    try:
        execs, resets = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            sb.exec("true")
            execs.append(time.perf_counter() - t0)
            note("exec")
        for i in range(n):
            resets.append(sb.reset(i).seconds)
            note("reset")
    finally:
        sb.destroy()

    warm: list[float] = []
    with WarmPool(backend.create, pool_size, max_create_per_s=8, prepare=lambda s: s.reset(0)) as pool:
        pool.wait_ready(timeout=120)
        for _ in range(n):
            t0 = time.perf_counter()
            got = pool.acquire()
            warm.append(time.perf_counter() - t0)
            pool.release(got)
            pool.wait_ready(timeout=120)
            note("warm_acquire")
        hits = pool.stats.hits

    rows = [_row("cold_start", cold), _row("warm_acquire", warm), _row("exec", execs), _row("reset", resets)]
    return rows, {"n": n, "pool_size": pool_size, "warm_pool_hits": hits, "image_id": runtime.build.image_id}


def bench_resets(runtimes: list[EnvRuntime], *, n: int = 50, tick: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Reset latency per environment, on one container each (no re-creation), plus a check
    that every reset gave the same state hash."""
    note = tick or (lambda _m: None)
    rows = []
    for runtime in runtimes:
        sb = runtime.backend.create()
        try:
            sb.reset(0)  # first reset starts services; not counted
            samples, hashes = [], set()
            for _ in range(n):
                t0 = time.perf_counter()
                hashes.add(sb.reset(0).state_hash)
                samples.append(time.perf_counter() - t0)
                note(runtime.env.ref)
        finally:
            sb.destroy()
        p50 = percentile(samples, 50)
        rows.append({"env": runtime.env.ref, "kind": runtime.env.spec.environment.kind, "n": n,
                     "p50_ms": round(p50 * 1000, 2), "p90_ms": round(percentile(samples, 90) * 1000, 2),
                     "target": "p50 <= 100 ms" if runtime.env.spec.state.database is not None else "",
                     "passed": (p50 <= 0.100) if runtime.env.spec.state.database is not None else None,
                     "same_hash": len(hashes) == 1})
    return rows
