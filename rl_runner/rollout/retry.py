"""The retry rule, in one place for both backends of the rollout seam
(:mod:`rl_runner.distributed.rollouts`, through which training, evaluation, ``envkit rollout``
and ``envkit bench rollout`` run every episode): attempts run until one ends in something other
than an infra or verifier failure, at most ``max_retries`` retries; the first attempt that is
not retried is the result, with ``retries`` and the failed ``attempts``; when the retries run
out the episode is excluded with its last failure. A model's own failure is a result, never
retried."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envkit.errors import EpisodeFailure, OutcomeLabel, parse_outcome
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["StopRetrying", "excluded_after", "failure_record", "retryable", "run_attempts"]


def retryable(outcome: str) -> bool:
    """Infra and verifier failures are retried; a model's own failure is a result."""
    return parse_outcome(outcome).retryable


class StopRetrying(Exception):  # noqa: N818 - a signal to the loop, not an error to anyone
    """Raised by an attempt when no further attempt can run (e.g. no live host is left): the
    episode is excluded with this failure at once."""

    def __init__(self, label: str, evidence: dict[str, Any]) -> None:
        super().__init__(label)
        self.label, self.evidence = label, evidence


def failure_record(describe: Callable[[], Trajectory], label: str, evidence: dict[str, Any]) -> Trajectory:
    """The record of an attempt that ended in a failure (no reward; excluded from training)."""
    traj = describe()
    traj.outcome, traj.evidence, traj.excluded, traj.exclude_reason = label, evidence, True, label
    return traj


def excluded_after(describe: Callable[[], Trajectory], label: str, evidence: dict[str, Any],
                   attempts: list[OutcomeLabel], attempt_evidence: list[dict[str, Any]] | None = None) -> Trajectory:
    traj = describe()
    traj.outcome, traj.evidence, traj.excluded = label, evidence, True
    traj.exclude_reason = f"{label} after {len(attempts)} attempts"
    traj.retries, traj.attempts = max(0, len(attempts) - 1), list(attempts)
    traj.attempt_evidence = list(attempt_evidence or [])
    return traj


def run_attempts(attempt: Callable[[int, list[str]], Trajectory], *, max_retries: int,
                 describe: Callable[[], Trajectory]) -> Trajectory:
    """Call ``attempt(n, failed_so_far)`` for n = 0, 1, … under the retry rule. An attempt
    returns its trajectory or raises :class:`~envkit.errors.EpisodeFailure` (recorded as
    :func:`failure_record`) or :class:`StopRetrying`. ``describe()`` makes the empty record of
    the episode."""
    attempts: list[OutcomeLabel] = []
    evidence: list[dict[str, Any]] = []
    last: tuple[str, dict[str, Any]] = ("", {})
    for n in range(max_retries + 1):
        try:
            traj = attempt(n, list(attempts))
        except StopRetrying as stop:
            last = (stop.label, stop.evidence)
            break
        except EpisodeFailure as failure:
            traj = failure_record(describe, failure.outcome.label, failure.evidence)
        if not retryable(traj.outcome):
            traj.retries, traj.attempts, traj.attempt_evidence = n, list(attempts), list(evidence)
            return traj
        last = (traj.outcome, traj.evidence)
        attempts.append(traj.outcome)
        evidence.append(dict(traj.evidence))
    return excluded_after(describe, last[0], last[1], attempts, evidence)
