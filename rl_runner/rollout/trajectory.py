"""The trajectory record: the contract between runner, trainer and registry (docs/rollout.md).

Token streams are aligned: ``completion_token_ids``, ``logprobs``, ``weight_versions`` and
``loss_mask`` have one entry per token after the prompt. Model tokens have mask 1, their
behaviour log-prob and the weight version that sampled them; observation and template tokens
have mask 0, log-prob 0.0 and version "".

``outcome`` (and each of ``attempts``) is an :class:`~envkit.errors.OutcomeLabel`, whatever
string is assigned to it; on disk it is the label's string, as always. Records are written
with :func:`write_jsonl` and read with :func:`read_jsonl` (``Trajectory.to_dict`` /
``Trajectory.from_dict``), nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from envkit.errors import FailureCategory, OutcomeLabel, format_outcome, parse_outcome

__all__ = ["Trajectory", "apply_group_rule", "read_jsonl", "write_jsonl"]


class _OutcomeField:
    """A dataclass field that parses every string assigned to it into an OutcomeLabel (a
    descriptor-typed field: dataclasses take the default from ``__get__(None, cls)``), so a
    record never holds an unparsed label, however it was set."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = f"_{name}"

    def __get__(self, obj: object, owner: type | None = None) -> OutcomeLabel:
        if obj is None:
            return format_outcome(FailureCategory.OK)
        label: OutcomeLabel = obj.__dict__[self.attr]
        return label

    def __set__(self, obj: object, value: str) -> None:
        obj.__dict__[self.attr] = parse_outcome(value)


@dataclass
class Trajectory:
    env_ref: str
    image_digest: str
    task_id: str
    seed: int
    group_id: str
    bundle_digest: str = ""  # the environment's bundle (its content), beside the image it ran in
    runtime: str = ""  # the OCI runtime its sandbox ran under: runc or gvisor (envkit.sandbox.runtimes)
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[str] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    reward: float | None = None
    outcome: _OutcomeField = _OutcomeField()
    evidence: dict[str, Any] = field(default_factory=dict)
    verifier: dict[str, Any] = field(default_factory=dict)  # the verifier's own details (its output; cut at 8 kB)
    retries: int = 0
    attempts: list[OutcomeLabel] = field(default_factory=list)  # outcomes of the failed attempts before this one
    attempt_evidence: list[dict[str, Any]] = field(default_factory=list)  # and their evidence, in the same order
    excluded: bool = False
    exclude_reason: str = ""
    turns: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)  # where it ran, on a cluster (sandbox host, worker node)
    late: bool = False  # finished after its group entered a batch: it joins a later one (partial groups)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """The record of :meth:`to_dict` (a JSONL line). Fields a line lacks take their
        defaults; keys this version does not know are left out."""
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.attempts = [parse_outcome(a) for a in record.attempts]
        return record


def apply_group_rule(trajectories: list[Trajectory], min_members: int = 2) -> list[Trajectory]:
    """Groups with excluded members: the remaining members stay trainable (their advantages
    are computed over the remaining members) if at least ``min_members`` remain; otherwise
    the whole group is excluded with reason ``group_too_small``. Returns the trajectories."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    for members in groups.values():
        kept = [t for t in members if not t.excluded]
        if len(kept) < min_members and len(kept) != len(members):
            for t in kept:
                t.excluded = True
                t.exclude_reason = "group_too_small"
    return trajectories


def write_jsonl(path: str | Path, trajectories: list[Trajectory]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), sort_keys=True) + "\n")
    return out


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """The trajectories :func:`write_jsonl` wrote (earlier versions' files included)."""
    return [Trajectory.from_dict(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
