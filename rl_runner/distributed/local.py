"""The runner's local backend (this machine's Docker, episodes on threads) and what both
backends share: the context an episode function gets.

An *episode function* is a module-level callable ``fn(ctx: EpisodeContext, **kwargs) ->
Trajectory``. It takes its sandboxes from ``ctx.sandboxes`` and its policy from ``ctx.policy``,
so the same function runs here or on a Ray cluster (:mod:`rl_runner.distributed.ray_backend`).
A backend's ``run(fn, kwargs, session=, cancel=, describe=)`` runs attempts under the retry rule
of :mod:`rl_runner.rollout.retry` (each retry on a fresh sandbox) and returns the one trajectory
that counts; ``describe()`` makes the record of an episode that never ran.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envkit.runtime import EnvRuntime
from rl_runner.policy.router import Router
from rl_runner.rollout.retry import run_attempts
from rl_runner.rollout.reuse import FreshSandboxes, Sandboxes, sandbox_pool, sandbox_stats
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["EpisodeContext", "LocalRollouts", "split"]


@dataclass
class EpisodeContext:
    """What an episode function gets: the environment, the policy (a router over the vLLM
    replicas), the sandboxes to take from, a cancel flag (checked at turn boundaries), the
    routing session, ``extra`` (what the backend's ``setup`` made, e.g. a tokenizer) and
    ``attempt`` (0 for the first)."""

    runtime: EnvRuntime
    policy: Router
    sandboxes: Any
    cancel: threading.Event
    session: str | None
    extra: Any = None
    attempt: int = 0


class LocalRollouts:
    """Episodes on this machine: sandboxes from its Docker engine, the policy a router."""

    def __init__(self, runtime: EnvRuntime, router: Router, *, max_retries: int = 2, extra: Any = None) -> None:
        self.runtime, self.router, self.max_retries, self.extra = runtime, router, max_retries, extra
        self.sandboxes: Sandboxes = FreshSandboxes(runtime.backend)

    def configure(self, kind: str, size: int) -> None:
        """A new sandbox supply: ``pool`` (a reusing warm pool of ``size``) or ``fresh``."""
        old = self.sandboxes
        self.sandboxes = sandbox_pool(self.runtime.backend, size) if kind == "pool" else FreshSandboxes(self.runtime.backend)
        old.close()

    def occupancy(self, t0: float, t1: float) -> tuple[float, float]:
        """(held, alive) sandbox-seconds over a window of the monotonic clock."""
        return self.sandboxes.held.integral(t0, t1), self.sandboxes.alive.integral(t0, t1)

    def sandbox_stats(self) -> dict[str, Any]:
        return sandbox_stats(self.sandboxes)

    def run(self, fn: Callable[..., Trajectory], kwargs: dict[str, Any], *, session: str, cancel: threading.Event,
            describe: Callable[[], Trajectory]) -> Trajectory:
        def attempt(n: int, failed: list[str]) -> Trajectory:
            sandboxes = self.sandboxes if n == 0 else FreshSandboxes(self.runtime.backend)
            return fn(EpisodeContext(self.runtime, self.router, sandboxes, cancel, session, self.extra, n), **kwargs)

        return run_attempts(attempt, max_retries=self.max_retries, describe=describe)

    def close(self) -> None:
        self.sandboxes.close()
        self.router.close()


def split(size: int, parts: int) -> int:
    """Each of ``parts`` hosts' share of ``size`` sandboxes."""
    return math.ceil(size / max(1, parts))
