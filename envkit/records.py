"""What an episode leaves behind: each tool step, the verifier's verdict and the episode's
result (outcome, evidence, state hash, timings). :mod:`envkit.runtime` makes them; the
environment kinds (:mod:`envkit.kinds`) return verdicts; the CLI prints results."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["EpisodeResult", "StepRecord", "VerifyResult"]


@dataclass(frozen=True)
class StepRecord:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    limit_hit: str | None


@dataclass(frozen=True)
class VerifyResult:
    reward: float
    details: dict[str, Any]
    duration_s: float


@dataclass
class EpisodeResult:
    env: str
    image_id: str
    task_id: str
    seed: int
    agent: str
    reward: float | None
    outcome: str
    evidence: dict[str, Any]
    state_hash: str
    steps: list[StepRecord] = field(default_factory=list)
    verifier: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    runtime: str = ""  # the sandbox's OCI runtime: runc | gvisor

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
