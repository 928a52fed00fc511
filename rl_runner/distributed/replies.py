"""What crosses between the Ray backend's processes: replies as typed values (a failure as
data, rebuilt into its exception on the other side) and the clock offset that turns one
process's wall-clock times into another's monotonic ones."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envkit.errors import EpisodeFailure, FailureCategory, InfraFailure, ModelFailure, VerifierFailure, format_outcome
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["Failure", "HostReply", "WorkerReply", "wall_offset"]

_EXCEPTIONS: dict[str, type[EpisodeFailure]] = {FailureCategory.INFRA.value: InfraFailure,
                                                FailureCategory.MODEL.value: ModelFailure,
                                                FailureCategory.VERIFIER.value: VerifierFailure}


@dataclass(frozen=True)
class Failure:
    """An :class:`~envkit.errors.EpisodeFailure` as data."""

    category: str
    kind: str
    message: str
    evidence: dict[str, Any]

    @classmethod
    def of(cls, e: EpisodeFailure) -> Failure:
        return cls(e.category.value, e.kind, e.message, dict(e.evidence))

    @property
    def label(self) -> str:
        return format_outcome(FailureCategory(self.category), self.kind)

    def exception(self) -> EpisodeFailure:
        evidence = {k: v for k, v in self.evidence.items() if k != "message"}
        return _EXCEPTIONS[self.category](self.kind, self.message, **evidence)


@dataclass(frozen=True)
class HostReply:
    """A sandbox host's answer to one call: its value, or the failure it raised."""

    value: Any = None
    failure: Failure | None = None

    @classmethod
    def failed(cls, e: EpisodeFailure) -> HostReply:
        return cls(failure=Failure.of(e))

    def unwrap(self) -> Any:
        if self.failure is not None:
            raise self.failure.exception()
        return self.value


@dataclass(frozen=True)
class WorkerReply:
    """A rollout worker's answer for one attempt: the trajectory or the failure that ended it,
    the generation requests it made (wall-clock spans, for the driver's router) and its node."""

    trajectory: Trajectory | None
    failure: Failure | None
    node: str
    events: list[tuple[int, float, float, int, int]] = field(default_factory=list)


def wall_offset() -> float:
    """wall clock − monotonic clock, in this process now."""
    return time.time() - time.monotonic()
