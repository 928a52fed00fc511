"""Where episodes get their sandboxes: a warm pool that reuses clean sandboxes, or (the
naive baseline) a fresh container per episode.

An episode starts with ``reset(seed)``, which kills every agent process, wipes the workspace
and the scratch mounts, restores the seeded repository / database and checks the state hash
against the first one seen for that seed (``nondeterministic_reset`` otherwise). So a sandbox
that ended its episode cleanly can serve the next episode of the same environment without
the cost of creating and destroying a container (on this 2-core machine, under load, ~1 s
each way). A sandbox whose episode ended in an infra failure, or that hit a resource limit,
is destroyed (in the background), never reused.

:class:`SandboxPool` with ``size > 0`` keeps that many sandboxes alive (held by episodes,
idle, or being created), created ahead of demand by a filler thread at a bounded rate and
parallelism, independently of how many episodes or inference requests run. ``size = 0``
creates on demand and keeps up to ``max_idle`` clean ones for reuse. Both record how many
sandboxes were alive and held over time (:class:`~rl_runner.batch.occupancy.Occupancy`), so a
run can report sandbox utilisation.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envkit.errors import InfraFailure
from envkit.sandbox import Sandbox
from envkit.sandbox.pool import RateLimiter
from rl_runner.batch.occupancy import Occupancy

__all__ = ["FreshSandboxes", "SandboxPool"]


class SandboxPool:
    def __init__(self, backend: Any, *, size: int = 0, max_idle: int = 64, max_parallel_create: int = 4,
                 max_create_per_s: float = 8.0) -> None:
        if size < 0:
            raise ValueError("size must be >= 0")
        self.backend = backend
        self.size = size
        self.max_idle = max_idle if size == 0 else size
        self.max_parallel = max(1, max_parallel_create)
        self.limiter = RateLimiter(max_create_per_s, burst=self.max_parallel)
        self.idle: list[Sandbox] = []
        self.cv = threading.Condition()
        self.held_n = 0
        self.creating = 0
        self.closed = False
        self.created = 0
        self.reused = 0
        self.destroyed = 0
        self.create_failures = 0
        self.last_error = ""
        self.alive = Occupancy()  # sandboxes that exist (being created, idle, held, being destroyed)
        self.held = Occupancy()  # sandboxes an episode holds
        self.workers = ThreadPoolExecutor(max_workers=self.max_parallel + 2, thread_name_prefix="sandbox-pool")
        self.filler: threading.Thread | None = None
        if size:
            self.filler = threading.Thread(target=self._fill, name="sandbox-pool-filler", daemon=True)
            self.filler.start()

    # -- filling ---------------------------------------------------------------------------
    def _fill(self) -> None:
        while True:
            with self.cv:
                while not self.closed and (len(self.idle) + self.held_n + self.creating >= self.size
                                           or self.creating >= self.max_parallel):
                    self.cv.wait()
                if self.closed:
                    return
            delay = self.limiter.wait_time()
            if delay > 0:
                time.sleep(delay)
                continue
            with self.cv:
                if self.closed:
                    return
                self.creating += 1
            self.workers.submit(self._create_one)

    def _create_one(self) -> None:
        self.alive.add(1)
        try:
            sandbox = self.backend.create()
        except Exception as e:  # noqa: BLE001 - recorded; the filler tries again at the rate limit
            self.alive.add(-1)
            with self.cv:
                self.creating -= 1
                self.create_failures += 1
                self.last_error = f"{type(e).__name__}: {e}"[:500]
                self.cv.notify_all()
            time.sleep(0.5)
            return
        with self.cv:
            self.creating -= 1
            self.created += 1
            orphan = self.closed
            if not orphan:
                self.idle.append(sandbox)
            self.cv.notify_all()
        if orphan:
            self._destroy(sandbox)

    def _destroy(self, sandbox: Sandbox) -> None:
        try:
            sandbox.destroy()
        except Exception:  # noqa: BLE001 - cleanup must not hide the episode's result; cleanup() sweeps by label
            pass
        self.alive.add(-1)
        with self.cv:
            self.destroyed += 1
            self.cv.notify_all()

    # -- use -------------------------------------------------------------------------------
    def acquire(self, timeout: float = 600) -> Sandbox:
        deadline = time.monotonic() + timeout
        sandbox: Sandbox | None
        with self.cv:
            while True:
                if self.closed:
                    raise InfraFailure("pool_closed", "the sandbox pool is closed")
                if self.idle:
                    sandbox = self.idle.pop()
                    if getattr(sandbox, "_envkit_used", False):
                        self.reused += 1
                    self.held_n += 1
                    break
                if self.size == 0:
                    self.held_n += 1
                    self.creating += 1
                    sandbox = None
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InfraFailure("pool_timeout", f"no sandbox became free in {timeout:g} s "
                                       f"(pool size {self.size}, {self.held_n} held)", last_error=self.last_error)
                self.cv.wait(min(left, 1.0))
        if sandbox is None:  # on demand (size 0)
            self.alive.add(1)
            try:
                sandbox = self.backend.create()
            except BaseException:
                self.alive.add(-1)
                with self.cv:
                    self.held_n -= 1
                    self.creating -= 1
                raise
            with self.cv:
                self.creating -= 1
                self.created += 1
        self.held.add(1)
        return sandbox

    def release(self, sandbox: Sandbox, *, reusable: bool) -> None:
        self.held.add(-1)
        with self.cv:
            self.held_n -= 1
            keep = reusable and not self.closed and len(self.idle) < self.max_idle
            if keep:
                sandbox._envkit_used = True  # type: ignore[attr-defined]
                self.idle.append(sandbox)
            self.cv.notify_all()
        if not keep:
            self.workers.submit(self._destroy, sandbox)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            idle, self.idle = self.idle, []
            self.cv.notify_all()
        for sb in idle:
            self.workers.submit(self._destroy, sb)
        if self.filler is not None:
            self.filler.join(timeout=10)
        self.workers.shutdown(wait=True)

    def stats(self) -> dict[str, Any]:
        return {"kind": "pool", "size": self.size, "created": self.created, "reused": self.reused,
                "destroyed": self.destroyed, "create_failures": self.create_failures}


class FreshSandboxes:
    """The naive baseline: every episode creates its container when it starts and destroys it
    when it ends, both on the episode's own clock."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.alive = Occupancy()
        self.held = Occupancy()
        self.lock = threading.Lock()
        self.created = 0
        self.destroyed = 0

    def acquire(self, timeout: float = 600) -> Sandbox:
        self.alive.add(1)
        try:
            sandbox = self.backend.create()
        except BaseException:
            self.alive.add(-1)
            raise
        with self.lock:
            self.created += 1
        self.held.add(1)
        return sandbox

    def release(self, sandbox: Sandbox, *, reusable: bool) -> None:
        self.held.add(-1)
        try:
            sandbox.destroy()
        except Exception:  # noqa: BLE001 - cleanup must not hide the episode's result
            pass
        self.alive.add(-1)
        with self.lock:
            self.destroyed += 1

    def close(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"kind": "fresh", "size": 0, "created": self.created, "reused": 0, "destroyed": self.destroyed,
                "create_failures": 0}
