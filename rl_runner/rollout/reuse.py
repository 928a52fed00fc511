"""Sandbox reuse across episodes of one environment.

An episode starts with ``reset(seed)``, which kills every agent process, wipes the workspace
and the scratch mounts, restores the seeded repository / database and checks the state hash
against the first one seen for that seed (``nondeterministic_reset`` otherwise). So a
sandbox that ended its episode cleanly can serve the next episode of the same environment
without the cost of creating and destroying a container (on this 2-core machine, under load,
~1 s each way). A sandbox whose episode ended in an infra failure, or that hit a resource
limit, is destroyed, never reused.
"""

from __future__ import annotations

import threading
from typing import Any

from envkit.sandbox import Sandbox

__all__ = ["SandboxReuse"]


class SandboxReuse:
    def __init__(self, backend: Any, *, max_idle: int = 64) -> None:
        self.backend = backend
        self.max_idle = max_idle
        self.idle: list[Sandbox] = []
        self.lock = threading.Lock()
        self.created = 0
        self.reused = 0

    def acquire(self) -> Sandbox:
        with self.lock:
            if self.idle:
                self.reused += 1
                return self.idle.pop()
            self.created += 1
        return self.backend.create()

    def release(self, sandbox: Sandbox, *, reusable: bool) -> None:
        if reusable:
            with self.lock:
                if len(self.idle) < self.max_idle:
                    self.idle.append(sandbox)
                    return
        _destroy(sandbox)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for sb in idle:
            _destroy(sb)


def _destroy(sandbox: Sandbox) -> None:
    try:
        sandbox.destroy()
    except Exception:  # noqa: BLE001 - cleanup must not hide the episode's result
        pass
