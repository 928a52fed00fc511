"""The local backend of the rollout seam (:mod:`rl_runner.distributed.rollouts`): episodes on
the caller's threads, sandboxes from this machine's Docker engine."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from envkit.runtime import EnvRuntime
from envkit.sandbox.pool import WarmPool
from rl_runner.distributed.context import EpisodeContext, before_attempt, queued
from rl_runner.policy.router import Router
from rl_runner.rollout.retry import run_attempts
from rl_runner.rollout.reuse import FreshSandboxes, Sandboxes, sandbox_pool, sandbox_stats
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["LocalRollouts", "split"]


class LocalRollouts:
    """Episodes on this machine: sandboxes from its Docker engine, the policy a router (the
    caller's: it closes it)."""

    def __init__(self, runtime: EnvRuntime, router: Router, *, max_retries: int = 2, extra: Any = None,
                 policy_ready: Callable[[], bool] | None = None) -> None:
        self.runtime, self.router, self.max_retries, self.extra = runtime, router, max_retries, extra
        self.policy_ready = policy_ready
        self.sandboxes: Sandboxes = FreshSandboxes(runtime.backend)

    def configure(self, kind: str, size: int, *, fill_timeout: float = 0.0) -> None:
        old = self.sandboxes
        self.sandboxes = new = (sandbox_pool(self.runtime.backend, size) if kind == "pool"
                                else FreshSandboxes(self.runtime.backend))
        old.close()
        if isinstance(new, WarmPool) and fill_timeout > 0:
            new.wait_ready(timeout=fill_timeout)

    def occupancy(self, t0: float, t1: float) -> tuple[float, float]:
        return self.sandboxes.held.integral(t0, t1), self.sandboxes.alive.integral(t0, t1)

    def sandbox_stats(self) -> dict[str, Any]:
        return sandbox_stats(self.sandboxes)

    def run(self, fn: Callable[..., Trajectory], kwargs: dict[str, Any], *, session: str, cancel: threading.Event,
            describe: Callable[[], Trajectory], on_attempt: Callable[[int], None] | None = None) -> Trajectory:
        since = time.monotonic()

        def attempt(n: int, failed: list[str]) -> Trajectory:
            before_attempt(n, failed, policy_ready=self.policy_ready, on_attempt=on_attempt)
            sandboxes = self.sandboxes if n == 0 else FreshSandboxes(self.runtime.backend)
            return fn(EpisodeContext(self.runtime, self.router, sandboxes, cancel, session, self.extra, n), **kwargs)

        return queued(run_attempts(attempt, max_retries=self.max_retries, describe=describe), since)

    def close(self) -> None:
        self.sandboxes.close()


def split(size: int, parts: int) -> int:
    """Each of ``parts`` hosts' share of ``size`` sandboxes."""
    return math.ceil(size / max(1, parts))
