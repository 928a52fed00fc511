"""The runner's local backend (this machine's Docker, episodes on threads) and what both
backends share: the context an episode function gets, and the retry rule.

An *episode function* is a module-level callable ``fn(ctx: EpisodeContext, **kwargs) ->
Trajectory``. It takes its sandboxes from ``ctx.sandboxes`` and its policy from ``ctx.policy``,
so the same function runs here or on a Ray cluster (:mod:`rl_runner.distributed.ray_backend`).
A backend's ``run(fn, kwargs, session=, cancel=, describe=)`` runs attempts until one is not an
infra or verifier failure (at most ``max_retries`` retries, each on a fresh sandbox) and returns
that one trajectory, with ``retries`` and the failed ``attempts``; when the retries run out it
returns ``describe()`` marked excluded with the last failure.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envkit.errors import EpisodeFailure, FailureCategory
from envkit.runtime import EnvRuntime
from rl_runner.policy.router import Router
from rl_runner.rollout.reuse import FreshSandboxes, Sandboxes, sandbox_pool, sandbox_stats
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["EpisodeContext", "LocalRollouts", "excluded_after", "failed", "retryable"]


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


def retryable(outcome: str) -> bool:
    """Infra and verifier failures are retried; a model's own failure is a result."""
    return outcome.startswith((FailureCategory.INFRA.value, FailureCategory.VERIFIER.value))


def failed(describe: Callable[[], Trajectory], label: str, evidence: dict[str, Any], attempt: int,
           attempts: list[str]) -> Trajectory:
    """The record of an episode that ended in a failure that is not retried (the model's)."""
    traj = describe()
    traj.outcome, traj.evidence, traj.excluded, traj.exclude_reason = label, evidence, True, label
    traj.retries, traj.attempts = attempt, list(attempts)
    return traj


def excluded_after(describe: Callable[[], Trajectory], label: str, evidence: dict[str, Any],
                   attempts: list[str]) -> Trajectory:
    traj = describe()
    traj.outcome, traj.evidence, traj.excluded = label, evidence, True
    traj.exclude_reason = f"{label} after {len(attempts)} attempts"
    traj.retries, traj.attempts = max(0, len(attempts) - 1), list(attempts)
    return traj


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
        attempts: list[str] = []
        last: tuple[str, dict[str, Any]] = ("", {})
        for attempt in range(self.max_retries + 1):
            sandboxes = self.sandboxes if attempt == 0 else FreshSandboxes(self.runtime.backend)
            ctx = EpisodeContext(self.runtime, self.router, sandboxes, cancel, session, self.extra, attempt)
            try:
                traj = fn(ctx, **kwargs)
            except EpisodeFailure as e:
                if not retryable(e.outcome.label):
                    return failed(describe, e.outcome.label, e.evidence, attempt, attempts)
                last = (e.outcome.label, e.evidence)
                attempts.append(last[0])
                continue
            if not retryable(traj.outcome):
                traj.retries, traj.attempts = attempt, list(attempts)
                return traj
            last = (traj.outcome, traj.evidence)
            attempts.append(last[0])
        return excluded_after(describe, last[0], last[1], attempts)

    def close(self) -> None:
        self.sandboxes.close()
        self.router.close()


def split(size: int, parts: int) -> int:
    """Each of ``parts`` hosts' share of ``size`` sandboxes."""
    return math.ceil(size / max(1, parts))
