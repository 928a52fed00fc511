"""A warm pool of sandboxes: a target size, a creation rate limit, health checks.

A filler thread keeps sandboxes started (and prepared, e.g. reset) ahead of demand, creating
at most ``max_create_per_s`` per second (a token bucket) with at most ``max_parallel``
creations in flight, so a burst of demand never stampedes the engine. ``acquire()`` hands out
a ready sandbox after a liveness check (a dead one is replaced), or waits for one.

Two modes:

* ``reuse=False`` (default): ``size`` sandboxes are kept *ready* ahead of demand; sandboxes
  are never reused: ``release()`` destroys in the background and the filler makes a fresh one.
* ``reuse=True`` (the RL runner's pool): ``size`` is the number of sandboxes *alive* (ready,
  held or being created), sized independently of how many episodes or inference requests run;
  ``release(sb, reusable=True)`` puts a sandbox whose episode ended cleanly back (the next
  episode's reset restores and checks the seeded state), ``reusable=False`` destroys it in the
  background and the filler replaces it. When every sandbox is held, ``acquire()`` waits.

Both record how many sandboxes were alive and held over time (:class:`Occupancy`), so a run
can report sandbox utilisation.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from envkit.errors import InfraFailure
from envkit.occupancy import Occupancy

__all__ = ["PoolStats", "RateLimiter", "WarmPool"]


class RateLimiter:
    """Token bucket: ``rate`` tokens per second, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.clock = clock
        self.tokens = self.burst
        self.last = clock()
        self.lock = threading.Lock()

    def wait_time(self) -> float:
        """Take a token if one is there (returns 0), else the seconds until one will be."""
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1:
                self.tokens -= 1
                return 0.0
            return (1 - self.tokens) / self.rate


@dataclass
class PoolStats:
    created: int = 0
    create_failures: int = 0
    hits: int = 0
    misses: int = 0
    reused: int = 0
    unhealthy: int = 0
    destroyed: int = 0
    create_seconds: list[float] = field(default_factory=list)
    last_error: str = ""


class WarmPool:
    def __init__(self, factory: Callable[[], Any], size: int, *, max_create_per_s: float = 4.0,
                 burst: float | None = None, max_parallel: int = 2, prepare: Callable[[Any], None] | None = None,
                 health: Callable[[Any], bool] | None = None, reuse: bool = False) -> None:
        if size < 0:
            raise ValueError("size must be >= 0")
        self.factory = factory
        self.size = size
        self.reuse = reuse
        self._held = 0
        self._checking = 0  # taken from _ready, health check not yet done: still counted toward size
        self.alive = Occupancy()  # sandboxes that exist (being created, ready, held, being destroyed)
        self.held = Occupancy()  # sandboxes handed out and not yet released
        self.prepare = prepare
        self.health = health if health is not None else (lambda sb: bool(sb.alive()))
        self.limiter = RateLimiter(max_create_per_s, burst)
        self.max_parallel = max(1, max_parallel)
        self.stats = PoolStats()
        self._ready: collections.deque[Any] = collections.deque()
        self._used: set[int] = set()  # id() of the sandboxes kept for reuse after an episode
        self._in_flight = 0
        self._cv = threading.Condition()
        self._closed = False
        self._workers = ThreadPoolExecutor(max_workers=self.max_parallel + 1, thread_name_prefix="envkit-pool")
        self._filler = threading.Thread(target=self._fill_loop, name="envkit-pool-filler", daemon=True)
        self._filler.start()

    # -- filling -------------------------------------------------------------------
    def _fill_loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (self._counted() >= self.size or self._in_flight >= self.max_parallel):
                    self._cv.wait()
                if self._closed:
                    return
            delay = self.limiter.wait_time()
            if delay > 0:
                time.sleep(delay)
                continue
            with self._cv:
                if self._closed:
                    return
                self._in_flight += 1
            self._workers.submit(self._create_one)

    def _counted(self) -> int:
        """What counts toward ``size`` (holding ``_cv``): ready and being created, plus held with reuse."""
        return len(self._ready) + self._in_flight + self._checking + (self._held if self.reuse else 0)

    def _create_one(self) -> None:
        t0 = time.monotonic()
        sandbox = None
        self.alive.add(1)
        try:
            sandbox = self.factory()
            if self.prepare is not None:
                self.prepare(sandbox)
        except Exception as e:  # noqa: BLE001 - recorded; the filler tries again at the rate limit
            with self._cv:
                self.stats.create_failures += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"[:500]
            if sandbox is not None:
                self._destroy(sandbox)
            else:
                self.alive.add(-1)
            time.sleep(min(1.0, 1.0 / self.limiter.rate))
            sandbox = None
        orphan = None
        with self._cv:
            self._in_flight -= 1
            if sandbox is not None:
                self.stats.created += 1
                self.stats.create_seconds.append(time.monotonic() - t0)
                if self._closed:
                    orphan = sandbox
                else:
                    self._ready.append(sandbox)
            self._cv.notify_all()
        if orphan is not None:
            self._destroy(orphan)

    def _destroy(self, sandbox: Any) -> None:
        try:
            sandbox.destroy()
        except Exception:  # noqa: BLE001 - destruction is best effort; cleanup() sweeps by label
            pass
        self.alive.add(-1)
        with self._cv:
            self.stats.destroyed += 1
            self._used.discard(id(sandbox))  # before the id can be another object's
            self._cv.notify_all()

    # -- use -----------------------------------------------------------------------
    @property
    def ready(self) -> int:
        with self._cv:
            return len(self._ready)

    def wait_ready(self, n: int | None = None, timeout: float = 120) -> bool:
        """Block until ``n`` (default: size) sandboxes are ready."""
        target = self.size if n is None else n
        deadline = time.monotonic() + timeout
        with self._cv:
            while len(self._ready) < target:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cv.wait(left)
            return True

    def acquire(self, timeout: float = 120) -> Any:
        """A ready, healthy sandbox. Waits for the filler if none is ready."""
        deadline = time.monotonic() + timeout
        first = True
        while True:
            with self._cv:
                if self._closed:
                    raise InfraFailure("pool_closed", "the sandbox pool is closed")
                if not self._ready and self.size == 0:
                    sandbox = None
                else:
                    while not self._ready:
                        if self._closed:
                            raise InfraFailure("pool_closed", "the sandbox pool is closed")
                        if first:
                            self.stats.misses += 1
                            first = False
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise InfraFailure("pool_timeout", f"no sandbox became ready in {timeout:g} s",
                                               last_error=self.stats.last_error)
                        self._cv.wait(left)
                    sandbox = self._ready.popleft()
                    self._checking += 1
                    if first:
                        self.stats.hits += 1
                    self._cv.notify_all()
            if sandbox is None:  # size 0: no pool, create on demand
                self.alive.add(1)
                try:
                    sandbox = self.factory()
                    if self.prepare is not None:
                        self.prepare(sandbox)
                except BaseException:
                    self.alive.add(-1)
                    raise
                return self._hand_out(sandbox)
            try:
                healthy = self.health(sandbox)
            except BaseException:
                with self._cv:
                    self._checking -= 1
                    self._cv.notify_all()
                self._workers.submit(self._destroy, sandbox)
                raise
            if healthy:
                return self._hand_out(sandbox, checked=True)
            with self._cv:
                self._checking -= 1
                self.stats.unhealthy += 1
                self._cv.notify_all()
            self._workers.submit(self._destroy, sandbox)

    def _hand_out(self, sandbox: Any, *, checked: bool = False) -> Any:
        with self._cv:
            self._checking -= checked  # from checking to held in one step: the filler never sees a gap
            self._held += 1
            if id(sandbox) in self._used:
                self.stats.reused += 1
            self._cv.notify_all()  # without reuse, a held sandbox no longer counts: the filler replaces it
        self.held.add(1)
        return sandbox

    def release(self, sandbox: Any, *, reusable: bool = False) -> None:
        """Give a sandbox back: with ``reuse`` and ``reusable`` it is ready for the next
        acquire; otherwise it is destroyed in the background (and the filler replaces it)."""
        self.held.add(-1)
        with self._cv:
            self._held -= 1
            keep = self.reuse and reusable and not self._closed
            if keep:
                self._used.add(id(sandbox))
                self._ready.append(sandbox)
            self._cv.notify_all()
        if not keep:
            self._workers.submit(self._destroy, sandbox)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            ready = list(self._ready)
            self._ready.clear()
            self._cv.notify_all()
        for sandbox in ready:
            self._workers.submit(self._destroy, sandbox)
        self._filler.join(timeout=10)
        self._workers.shutdown(wait=True)

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
