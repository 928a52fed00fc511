"""What every backend of the rollout seam shares: the context an episode function gets, what
runs before each attempt, and the queue time a finished episode records."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envkit.errors import parse_outcome
from envkit.runtime import EnvRuntime
from rl_runner.policy.router import Router
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["EpisodeContext", "before_attempt", "queued"]


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


def before_attempt(n: int, failed: list[str], *, policy_ready: Callable[[], bool] | None,
                   on_attempt: Callable[[int], None] | None, ready_timeout_s: float = 300) -> None:
    """What every backend does before attempt ``n``: after an ``inference_unavailable``
    failure, wait (up to ``ready_timeout_s``) for ``policy_ready`` (retrying against a server
    that is down only burns the retry); then the caller's hook."""
    if failed and parse_outcome(failed[-1]).kind == "inference_unavailable" and policy_ready is not None:
        deadline = time.monotonic() + ready_timeout_s
        while not policy_ready() and time.monotonic() < deadline:
            time.sleep(1.0)
    if on_attempt is not None:
        on_attempt(n)


def queued(traj: Trajectory, since: float) -> Trajectory:
    """Record the time the episode spent outside its final attempt (waiting, earlier attempts)."""
    traj.timings["queue_s"] = round(max(0.0, time.monotonic() - since - traj.timings.get("episode_s", 0.0)), 4)
    return traj
