"""Where episodes get their sandboxes: a warm pool that reuses clean sandboxes, or (the
naive baseline) a fresh container per episode.

An episode starts with ``reset(seed)``, which kills every agent process, wipes the workspace
and the scratch mounts, restores the seeded repository / database and checks the state hash
against the first one seen for that seed (``nondeterministic_reset`` otherwise). So a sandbox
that ended its episode cleanly can serve the next episode of the same environment without
the cost of creating and destroying a container (on this 2-core machine, under load, ~1 s
each way). A sandbox whose episode ended in an infra failure, or that hit a resource limit,
is destroyed (in the background), never reused.

:func:`sandbox_pool` is the SDK's :class:`~envkit.sandbox.pool.WarmPool` in its reuse mode
(``size`` sandboxes alive, created ahead of demand at a bounded rate, sized independently of
inference). :class:`FreshSandboxes` is the naive baseline. Both expose ``acquire()``,
``release(sandbox, reusable=)``, ``close()``, ``stats`` and the ``alive`` / ``held``
occupancies that sandbox utilisation is computed from.
"""

from __future__ import annotations

import threading
from typing import Any

from envkit.occupancy import Occupancy
from envkit.sandbox import Sandbox
from envkit.sandbox.pool import PoolStats, WarmPool

__all__ = ["FreshSandboxes", "Sandboxes", "sandbox_pool", "sandbox_stats"]


def sandbox_pool(backend: Any, size: int, *, max_parallel_create: int = 4, max_create_per_s: float = 8.0) -> WarmPool:
    """A reusing warm pool of ``size`` sandboxes of ``backend``'s environment."""
    return WarmPool(backend.create, size, reuse=True, max_parallel=max_parallel_create,
                    max_create_per_s=max_create_per_s)


class FreshSandboxes:
    """The naive baseline: every episode creates its container when it starts and destroys it
    when it ends, both on the episode's own clock."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.alive = Occupancy()
        self.held = Occupancy()
        self.stats = PoolStats()
        self.lock = threading.Lock()

    def acquire(self, timeout: float = 600) -> Sandbox:
        self.alive.add(1)
        try:
            sandbox = self.backend.create()
        except BaseException:
            self.alive.add(-1)
            raise
        with self.lock:
            self.stats.created += 1
        self.held.add(1)
        return sandbox

    def release(self, sandbox: Sandbox, *, reusable: bool = False) -> None:
        self.held.add(-1)
        try:
            sandbox.destroy()
        except Exception:  # noqa: BLE001 - cleanup must not hide the episode's result
            pass
        self.alive.add(-1)
        with self.lock:
            self.stats.destroyed += 1

    def close(self) -> None:
        pass


Sandboxes = WarmPool | FreshSandboxes


def sandbox_stats(sandboxes: Sandboxes) -> dict[str, Any]:
    s = sandboxes.stats
    return {"kind": "pool" if isinstance(sandboxes, WarmPool) else "fresh",
            "size": sandboxes.size if isinstance(sandboxes, WarmPool) else 0,
            "created": s.created, "reused": s.reused, "destroyed": s.destroyed, "create_failures": s.create_failures}
