"""`envkit bench sandbox`: cold start, warm acquire, exec round trip and reset, over N runs.

* cold start: create + start a container until a first command has run in it, and its two
  parts: the engine's create + start, and the first command (the channel's start included)
* warm acquire: take a ready sandbox from a full warm pool (liveness check included)
* exec round trip: one trivial command through the full exec path (the sandbox's command
  channel: user, timeout, limits, output caps), and the same through `docker exec` (the
  fallback, informational)
* reset: restore the seeded state and compute its hash (informational)

Each row also gives the host CPU per operation spent by the container engine (dockerd,
containerd, the containers' shims and the OCI runtime they start), read from /proc.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from envkit.runtime import EnvRuntime
from envkit.sandbox.pool import WarmPool

__all__ = ["BenchRow", "bench_sandbox", "percentile", "TARGETS"]

TARGETS = {"cold_start": ("p50", 0.150), "warm_acquire": ("p50", 0.020), "exec": ("p50", 0.005)}
HOST_CPU_TARGETS = {"exec": 0.002}  # engine CPU-seconds per command
# The container engine's processes on the host (/proc comm, 15 characters at most): their own
# CPU and that of the children they reaped. Those children are the OCI runtime's processes and
# what the engine started in a container and reaped itself: a `docker exec`'d command, a
# removed container's init and what it reaped. So `exec_docker` and `cold_start` include
# in-container CPU; `exec` does not (the channel reaps its commands inside the sandbox).
# (docker-init, the containers' PID 1, is in-container and not counted.)
_ENGINE = ("dockerd", "containerd", "containerd-shim", "runc")


def engine_cpu_snapshot() -> dict[tuple[str, ...], float]:
    """The container engine's CPU so far, in seconds, per thread (its run time in
    /proc/PID/task/TID/schedstat) and per process (what its exited children used,
    cutime+cstime). Keys carry the process's start time, so a reused PID is a new key."""
    snap: dict[tuple[str, ...], float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            if comm not in _ENGINE:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            started = fields[19]
            snap[(pid, started)] = (int(fields[13]) + int(fields[14])) / tick
            tids = os.listdir(f"/proc/{pid}/task")
        except (OSError, ValueError, IndexError):
            continue  # a process that exited while being read
        for tid in tids:
            try:  # each thread on its own: one that exits must not hide its siblings from this snapshot
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    snap[(pid, started, tid)] = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
    return snap


def engine_cpu_between(before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]) -> float:
    """Engine CPU-seconds used between two snapshots. Each counter only grows while its thread
    or process lives, so the sum is of per-key growth: a thread or process that appeared counts
    in full, one that exited in between counts nothing (its last slice is lost, never
    subtracted: a sum over whoever is alive would go negative when a busy thread exits)."""
    return sum(max(0.0, value - before.get(key, 0.0)) for key, value in after.items())


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
    host_cpu_ms: float | None = None  # the engine's CPU per operation
    host_cpu_target: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(metric: str, samples: list[float], engine_s: float | None = None) -> BenchRow:
    p50, p90 = percentile(samples, 50), percentile(samples, 90)
    target, passed = "", None
    if metric in TARGETS:
        which, limit = TARGETS[metric]
        value = p50 if which == "p50" else p90
        target = f"{which} <= {limit * 1000:g} ms"
        passed = value <= limit
    host_ms = None if engine_s is None else round(engine_s / len(samples) * 1000, 3)
    host_target = ""
    if metric in HOST_CPU_TARGETS and host_ms is not None:
        host_target = f"<= {HOST_CPU_TARGETS[metric] * 1000:g} ms"
        passed = bool(passed is not False and host_ms <= HOST_CPU_TARGETS[metric] * 1000)
    return BenchRow(metric, len(samples), round(p50 * 1000, 2), round(p90 * 1000, 2),
                    round(statistics.fmean(samples) * 1000, 2), target, passed, host_ms, host_target)


def bench_sandbox(runtime: EnvRuntime, *, n: int = 50, pool_size: int = 4,
                  tick: Callable[[str], None] | None = None) -> tuple[list[BenchRow], dict[str, Any]]:
    """Returns the table's rows and context (pool hits, sizes, image)."""
    backend = runtime.backend
    note = tick or (lambda _m: None)
    engine: dict[str, float] = {}

    cold: list[float] = []
    parts: dict[str, list[float]] = {"cold_start.engine": [], "cold_start.first_command": []}
    engine["cold_start"] = 0.0
    for _ in range(n):
        e0 = engine_cpu_snapshot()
        t0 = time.perf_counter()
        sb = backend.create()
        t1 = time.perf_counter()
        sb.exec("true")  # opens the command channel (one exec), then runs the command on it
        t2 = time.perf_counter()
        engine["cold_start"] += engine_cpu_between(e0, engine_cpu_snapshot())  # removal not included
        cold.append(t2 - t0)
        parts["cold_start.engine"].append(t1 - t0)
        parts["cold_start.first_command"].append(t2 - t1)
        sb.destroy()
        note("cold_start")

    sb = backend.create()
    fallback = backend.create()
    fallback.channel = False  # every command by its own `docker exec`
    try:
        timed: dict[str, list[float]] = {"exec": [], "exec_docker": [], "reset": []}
        sb.exec("true")  # opens the channel: counted in cold_start, not here
        for metric, box in (("exec", sb), ("exec_docker", fallback)):
            e0 = engine_cpu_snapshot()
            for _ in range(n):
                t0 = time.perf_counter()
                box.exec("true")
                timed[metric].append(time.perf_counter() - t0)
                note("exec")
            engine[metric] = engine_cpu_between(e0, engine_cpu_snapshot())
        e0 = engine_cpu_snapshot()
        for i in range(n):
            t0 = time.perf_counter()
            sb.reset(i)
            timed["reset"].append(time.perf_counter() - t0)
            note("reset")
        engine["reset"] = engine_cpu_between(e0, engine_cpu_snapshot())
    finally:
        sb.destroy()
        fallback.destroy()

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

    rows = [_row("cold_start", cold, engine["cold_start"]), *(_row(k, v) for k, v in parts.items()),
            _row("warm_acquire", warm),
            *(_row(metric, samples, engine[metric]) for metric, samples in timed.items())]
    return rows, {"n": n, "pool_size": pool_size, "warm_pool_hits": hits, "image_id": runtime.build.image_id,
                  "cpus": os.cpu_count()}


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
