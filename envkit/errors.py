"""envkit's exceptions and the failure taxonomy.

Every exception envkit raises derives from one root, :class:`EnvkitError`::

    EnvkitError
    ├── UserError                  bad input; the CLI prints ``message`` + ``hint``, exits 2
    │   ├── SpecError              envkit.toml / tasks file invalid: every problem at once
    │   ├── EnvRefError            a string that is not ``ns/name@version``
    │   ├── EnvNotFoundError       no environment at that path / ref
    │   ├── TaskNotFoundError      no task with that id (names the close ones)
    │   ├── DockerUnavailableError the Docker engine does not answer
    │   ├── BaseImageMissingError  the pinned base image is not in the local engine
    │   └── MissingExtraError      a command needs an optional dependency (names the extra)
    ├── BuildError                 image assembly failed for a reason that is not the input
    └── EpisodeFailure             an episode ended abnormally; carries ``outcome``
        ├── InfraFailure           caused by the infrastructure: retry on a fresh sandbox,
        │                          never counted against the model
        ├── ModelFailure           caused by the model's own actions inside the spec's limits:
        │                          keeps its reward
        └── VerifierFailure        the verifier itself broke (crashed, printed no reward)

The attribution rule (the one every classifier in envkit follows):

* What the model's own actions caused *inside the spec's limits* is a **model** failure:
  its command ran past ``command_timeout_s``, its process was OOM-killed at the spec's
  ``memory_mb``, it hit the spec's ``pids`` limit, it ran past ``episode_timeout_s``, it
  emitted an action that does not parse, it ran out of turns or tokens, its code ran past its
  time while the verifier called it (``code_timeout``), the sandbox of an agent that runs as
  root there (a container environment's default) stopped while the engine answers
  (``sandbox_stopped``: root in it can stop it).
* What the model could not have caused is an **infra** failure: the Docker daemon erred,
  the container never started or vanished, an exec transport error, a reset that was not
  deterministic, an inference server that did not answer.
* A verifier that times out, crashes or prints no reward on the agent's state is asked again
  on the seeded state of a fresh sandbox (counterfactual attribution, :mod:`envkit.runtime`):
  if it works there, the agent's state caused it, a **model** failure of the same kind
  (``verifier_timeout``, ``verifier_crash``, ``bad_output``) with reward 0; if it fails there
  too, a **verifier** failure (the environment's: excluded, like infra).

Outcome labels, the form every record keeps on disk (trajectories, JSONL, summaries)::

    label    := "ok" | category ":" kind
    category := "model_failure" | "infra_failure" | "verifier_failure" | "aborted"
    kind     := one or more characters, none of them ":" or whitespace

``aborted`` is the RL runner's: it cancelled the episode (a straggler); nobody's failure.
:func:`parse_outcome` reads one into an :class:`OutcomeLabel` (which *is* the string, with
``category``, ``kind`` and ``retryable``), :func:`format_outcome` writes one, and
``format_outcome(l.category, l.kind) == l`` for every label ``l``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "BaseImageMissingError",
    "BuildError",
    "DockerUnavailableError",
    "EnvNotFoundError",
    "EnvRefError",
    "EnvkitError",
    "EpisodeFailure",
    "FailureCategory",
    "InfraFailure",
    "MissingExtraError",
    "ModelFailure",
    "Outcome",
    "OutcomeLabel",
    "Problem",
    "SpecError",
    "TaskNotFoundError",
    "UserError",
    "VerifierFailure",
    "format_outcome",
    "parse_outcome",
]


class EnvkitError(Exception):
    """Root of every exception envkit raises."""


class UserError(EnvkitError):
    """Bad input from the user. ``hint`` says what to do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


@dataclass(frozen=True)
class Problem:
    """One validation problem: where it is, what is wrong, how to fix it."""

    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (fix: {self.fix})"


class SpecError(UserError):
    """An environment spec (or its task file) is invalid; lists every problem found."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        n = len(self.problems)
        super().__init__(
            f"{source}: {n} problem{'s' if n != 1 else ''}:\n{lines}",
            "fix the fields listed above and run the command again",
        )

    def __str__(self) -> str:
        return self.message


class EnvRefError(UserError):
    """A string that does not follow the env ref grammar ``ns/name@version``."""


class EnvNotFoundError(UserError):
    """No environment at a path or ref."""


class TaskNotFoundError(UserError):
    """A task id that the environment does not have."""

    def __init__(self, task_id: str, known: list[str], suggestions: list[str]) -> None:
        self.task_id = task_id
        self.known = known
        did_you_mean = f" Did you mean `{suggestions[0]}`?" if suggestions else ""
        super().__init__(
            f"Task `{task_id}` doesn't exist.{did_you_mean}",
            f"known tasks: {', '.join(known[:20])}{' …' if len(known) > 20 else ''}",
        )


class DockerUnavailableError(UserError):
    """The Docker engine does not answer."""


class BaseImageMissingError(UserError):
    """The base image an environment is pinned to is not in the local engine."""


class MissingExtraError(UserError):
    """``what`` needs ``modules``, which the optional dependency group ``extra`` installs
    (raised by :func:`envkit.extras.require`)."""

    def __init__(self, what: str, extra: str, modules: list[str], message: str, hint: str) -> None:
        super().__init__(message, hint)
        self.what = what
        self.extra = extra
        self.modules = modules


class BuildError(EnvkitError):
    """Image assembly failed for a reason other than the input."""


class FailureCategory(StrEnum):
    """Who ended an episode: the first part of its outcome label."""

    OK = "ok"
    MODEL = "model_failure"
    INFRA = "infra_failure"
    VERIFIER = "verifier_failure"
    ABORTED = "aborted"  # the RL runner cancelled it (a straggler): nobody's failure, never trained on


_KIND = re.compile(r"[^:\s]+")


class OutcomeLabel(str):
    """An outcome label (``ok`` or ``<category>:<kind>``, the grammar above), parsed.

    It is the label's string, equal to it, hashed and serialised as it (a ``str`` subclass
    rather than a pair, so every record, counter and JSON document keeps the form on disk it
    always had); code asks ``category``, ``kind`` and ``retryable`` instead of matching prefixes.
    Raises ``ValueError`` for a string outside the grammar."""

    __slots__ = ()

    def __new__(cls, label: str) -> OutcomeLabel:
        head, colon, kind = label.partition(":")
        try:
            category = FailureCategory(head)
        except ValueError:
            raise ValueError(
                f"`{label}` is not an outcome: it must be ok or one of "
                f"{', '.join(c.value + ':<kind>' for c in FailureCategory if c is not FailureCategory.OK)}") from None
        if category is FailureCategory.OK and colon:
            raise ValueError(f"`{label}` is not an outcome: ok takes no kind")
        if category is not FailureCategory.OK and not _KIND.fullmatch(kind):
            raise ValueError(f"`{label}` is not an outcome: {head} needs a kind after ':' (no ':' or spaces in it)")
        return super().__new__(cls, label)

    @property
    def category(self) -> FailureCategory:
        return FailureCategory(self.partition(":")[0])

    @property
    def kind(self) -> str:
        """What happened (``command_timeout``, ``container_lost``…); ``""`` for ok."""
        return self.partition(":")[2]

    @property
    def retryable(self) -> bool:
        """Not the model's doing (infra or verifier): retried on a fresh sandbox, excluded."""
        return self.category in (FailureCategory.INFRA, FailureCategory.VERIFIER)


def parse_outcome(label: str) -> OutcomeLabel:
    """Read an outcome label (a label already parsed is returned as it is)."""
    return label if isinstance(label, OutcomeLabel) else OutcomeLabel(label)


def format_outcome(category: FailureCategory, kind: str = "") -> OutcomeLabel:
    """The inverse of :func:`parse_outcome`: ``ok`` (no kind) or ``<category>:<kind>``."""
    return OutcomeLabel(category.value if category is FailureCategory.OK and not kind else f"{category.value}:{kind}")


@dataclass(frozen=True)
class Outcome:
    """How an episode ended: ``ok`` or ``<category>:<kind>``, with evidence."""

    category: FailureCategory
    kind: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> OutcomeLabel:
        return format_outcome(self.category, self.kind)

    @property
    def retryable(self) -> bool:
        return self.label.retryable

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.label, "evidence": self.evidence}

    @classmethod
    def ok(cls) -> Outcome:
        return cls(FailureCategory.OK)


class EpisodeFailure(EnvkitError):
    """An episode ended abnormally. ``outcome`` says who caused it and why."""

    category: FailureCategory = FailureCategory.INFRA

    def __init__(self, kind: str, message: str, **evidence: Any) -> None:
        super().__init__(f"{self.category.value}:{kind}: {message}")
        self.kind = kind
        self.message = message
        self.evidence = {"message": message, **evidence}

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.category, self.kind, self.evidence)


class InfraFailure(EpisodeFailure):
    """Caused by infrastructure the model does not control. Kinds include
    ``docker_api``, ``sandbox_start``, ``exec_transport``, ``container_lost``,
    ``nondeterministic_reset``, ``reset_failed``."""

    category = FailureCategory.INFRA


class ModelFailure(EpisodeFailure):
    """Caused by the model's own actions inside the spec's limits. Kinds include
    ``command_timeout``, ``oom``, ``pids_limit``, ``episode_timeout``,
    ``turn_limit``, ``unparseable_action``, ``code_timeout``, ``sandbox_stopped``, and the
    verifier kinds when the agent's state broke the verifier."""

    category = FailureCategory.MODEL


class VerifierFailure(EpisodeFailure):
    """The verifier crashed, timed out or printed no reward, on the seeded state as well (the
    environment's fault). Kinds include ``verifier_crash``, ``verifier_timeout``, ``bad_output``."""

    category = FailureCategory.VERIFIER
