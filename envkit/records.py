"""What an episode leaves behind: each tool step, what the agent observed, the verifier's
verdict and the episode's result (outcome, evidence, state hash, timings).
:mod:`envkit.runtime` makes them; the environment kinds (:mod:`envkit.kinds`) return
verdicts; the CLI prints results."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.errors import ModelFailure

__all__ = ["EpisodeResult", "Observation", "StepRecord", "VerifyResult"]


@dataclass(frozen=True)
class StepRecord:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    limit_hit: str | None


@dataclass(frozen=True)
class Observation:
    """What one agent action gives back (:meth:`envkit.runtime.Episode.act`): the text the
    agent sees; ``terminated``: the episode is over (an answer, or a model failure that ends
    it); ``truncated``: a budget ran out (turns, the episode's time)."""

    text: str
    terminated: bool = False
    truncated: bool = False

    @property
    def over(self) -> bool:
        return self.terminated or self.truncated


@dataclass(frozen=True)
class VerifyResult:
    """One verifier run's verdict. ``command_s``/``command_cpu_s``: the verifier command's own
    time and CPU as measured in the sandbox; ``model_failure``: what the run showed to be the
    agent's doing while the reward stands (its code ran past its time limit when called)."""

    reward: float
    details: dict[str, Any]
    duration_s: float
    command_s: float = 0.0
    command_cpu_s: float = 0.0
    model_failure: ModelFailure | None = None


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
