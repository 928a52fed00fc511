"""Per-step metrics of a training run: one JSON line per step in ``RUN_DIR/metrics.jsonl``
(the record `envkit report` and `envkit doctor` read) and the same numbers in TensorBoard
(``RUN_DIR/tb``), distributions as histograms.

The step record is typed: :class:`StepMetrics` and its parts, one dataclass per JSON object,
whose fields are the keys on disk (so runs written before these types read the same way).
It is written by :class:`MetricsLog` and read by :func:`read_metrics`, nowhere else. A
field a line lacks (a run written by an older version) reads as its default: ``None`` for a
figure, an empty part or mapping for the rest; keys this version does not know are left out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envkit.stats import percentile

__all__ = ["BatchStats", "Distribution", "Divergence", "EnvVersionFailures", "Failures", "MetricsLog", "Mismatch",
           "Publish", "Reward", "Signal", "Staleness", "StepMetrics", "TrainStats", "TrajectoryTimes", "distribution",
           "mean_or_none", "read_metrics"]


# -- the step record -------------------------------------------------------------------------


@dataclass
class Distribution:
    """:func:`distribution` of some values (``n`` 0 and the rest ``None`` for none)."""

    n: int | None = None
    mean: float | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    max: float | None = None


@dataclass
class TrajectoryTimes:
    """``batch.trajectory_s``: the batch's episode seconds."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


@dataclass
class BatchStats:
    """``batch``: the assembler's figures for the window the trainer waited for this batch
    (:meth:`rl_runner.batch.assembler.Assembler.window_stats`), then what the recipe measured
    over the same window."""

    ttb_s: float | None = None
    trajectories: int | None = None
    trajectory_s: TrajectoryTimes = field(default_factory=TrajectoryTimes)
    straggler_wait_share: float | None = None
    slot_idle_share: float | None = None
    work_s: float | None = None
    ideal_s: float | None = None
    carried_groups: int | None = None
    late_trajectories: int | None = None  # members whose group entered an earlier batch (partial groups)
    aborted_episodes: int | None = None
    # at the batch's close: seconds run so far by episodes still running (late members of
    # delivered groups apart) and the work of finished members of groups not yet ready
    in_flight_s: float | None = None
    in_flight_late_s: float | None = None
    finished_undelivered_s: float | None = None
    inference_idle_share: float | None = None
    sandbox_utilisation: float | None = None
    prefix_hit_rate: float | None = None
    replica_requests: list[int] = field(default_factory=list)  # generation requests per vLLM replica, so far
    sandboxes_created: int | None = None
    sandboxes_reused: int | None = None


@dataclass
class Reward:
    mean: float | None = None
    by_env: dict[str, float | None] = field(default_factory=dict)  # env ref -> mean reward of its usable episodes


@dataclass
class EnvVersionFailures:
    """``failures.by_env_version[<env ref> <image digest>]``."""

    episodes: int = 0
    infra_failures: int = 0  # excluded as infra
    retries: int = 0
    # first attempt failed as infra or verifier; None: a run before they were counted
    first_attempt_failures: int | None = None


@dataclass
class Failures:
    """``failures``: shares of the step's episodes (refused batches' included)."""

    infra: float | None = None  # excluded
    retried: float | None = None
    model: float | None = None
    verifier: float | None = None
    by_env_version: dict[str, EnvVersionFailures] = field(default_factory=dict)


@dataclass
class Staleness:
    """``staleness``: per-sample k3 KL to the trainer's weights and version lag, and admission."""

    kl: Distribution = field(default_factory=Distribution)
    lag: dict[str, int] = field(default_factory=dict)  # version lag (a string: JSON keys) -> samples
    admitted: int | None = None
    rejected: int | None = None  # refused batches' samples included
    kl_max: float | None = None  # the admission bound (async mode); None in sync mode


@dataclass
class Divergence:
    """vLLM's log-probs vs the trainer's, pooled over tokens: ``mismatch_batch``."""

    kl: float | None = None
    max_abs: float | None = None
    tokens: int | None = None


@dataclass
class Mismatch(Divergence):
    """``mismatch``: the probe at equal versions after a publication. ``Mismatch()`` (every
    field None) is a step without a probe (``probe_prompts: 0``), written ``{}`` as always."""

    round_trip_ok: bool | None = None  # every probe token reported the version just published


@dataclass
class TrainStats:
    """``train``: :meth:`rl_runner.trainer.trainer.Trainer.train_step`'s figures."""

    loss: float | None = None
    grad_norm: float | None = None
    model_tokens: int | None = None
    train_s: float | None = None
    is_weight_mean: float | None = None
    is_raw_max: float | None = None
    is_clipped_frac: float | None = None
    updated: bool | None = None  # False: every advantage was 0, the optimizer was not stepped
    kl_ref: float | None = None  # trainer.kl_coef > 0: the batch's mean KL(π || starting weights) per model token


@dataclass
class Signal:
    """``signal``: whether the step could teach anything. GRPO learns only from a group whose
    rewards differ; ``valid_actions`` is the share of episodes whose every action parsed;
    ``entropy`` the mean of ``-log p`` over the sampled model tokens (the sampling policy's
    per-token entropy, estimated from its own samples)."""

    groups: int | None = None  # groups with two or more usable episodes
    groups_with_signal: int | None = None  # of those, groups whose rewards are not all equal
    valid_actions: float | None = None
    entropy: float | None = None


@dataclass
class Publish:
    """``publish``: :class:`rl_runner.publish.PublishResult`."""

    version: str | None = None
    path: str | None = None
    write_s: float | None = None
    pause_s: float | None = None
    reload_s: float | None = None
    reset_cache_s: float | None = None
    resume_s: float | None = None
    total_s: float | None = None
    served_version: str | None = None  # what every replica reports, or "mixed"
    served_versions: list[str] = field(default_factory=list)  # per replica


@dataclass
class Throughput:
    """``throughput``: what the step produced over its whole time (collection, training and
    publication: from the end of the previous step to the end of this one), beside its TTB."""

    step_s: float | None = None
    generated_tokens: int | None = None  # by the model, in every episode of the step (refused batches' too)
    generated_tokens_per_s: float | None = None
    trajectories: int | None = None
    trajectories_per_s: float | None = None


@dataclass
class StepMetrics:
    """One line of ``metrics.jsonl``: one optimizer step."""

    step: int
    version: int | None = None
    mode: str | None = None
    wall_s: float | None = None  # since the loop started
    ttb_s: float | None = None  # the trainer's wait for this batch (refused batches' included)
    episodes: int | None = None
    batch: BatchStats = field(default_factory=BatchStats)
    trainable: int | None = None
    refused_batches: int | None = None  # batches with nothing to train on since the last step
    refused_episodes: int | None = None
    reward: Reward = field(default_factory=Reward)
    episode_s: Distribution = field(default_factory=Distribution)
    outcomes: dict[str, int] = field(default_factory=dict)  # outcome label -> episodes
    failures: Failures = field(default_factory=Failures)
    staleness: Staleness = field(default_factory=Staleness)
    mismatch: Mismatch = field(default_factory=Mismatch)
    mismatch_batch: Divergence = field(default_factory=Divergence)
    train: TrainStats = field(default_factory=TrainStats)
    signal: Signal = field(default_factory=Signal)
    publish: Publish = field(default_factory=Publish)
    throughput: Throughput = field(default_factory=Throughput)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.mismatch == Mismatch():
            out["mismatch"] = {}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics:
        record: StepMetrics = _read(cls, data)
        return record


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(cls: Any, data: dict[str, Any]) -> Any:
    """A record of dataclass ``cls`` from its JSON object; nested parts (and mappings of them)
    are read the same way."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        hint, value = hints[f.name], data[f.name]
        item = typing.get_args(hint)[1] if typing.get_origin(hint) is dict else None
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _read(hint, value)
        elif dataclasses.is_dataclass(item) and isinstance(value, dict):
            value = {k: _read(item, v) for k, v in value.items()}
        values[f.name] = value
    return cls(**values)


# -- figures -----------------------------------------------------------------------------------


def mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pct(values: list[float], p: float, digits: int = 3) -> float | None:
    """The ``p``-th percentile, rounded; None for no values."""
    return round(percentile(values, p), digits) if values else None


def distribution(values: list[float]) -> Distribution:
    if not values:
        return Distribution(n=0)
    return Distribution(n=len(values), mean=mean_or_none(values), p10=percentile(values, 10),
                        p50=percentile(values, 50), p90=percentile(values, 90), max=max(values))


def _scalars(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        if math.isfinite(float(value)):
            out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _scalars(f"{prefix}/{k}" if prefix else str(k), v, out)


# -- written and read here ---------------------------------------------------------------------


class MetricsLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def log(self, record: StepMetrics, histograms: dict[str, list[float]] | None = None) -> None:
        row = record.to_dict()
        with open(self.path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        if self.writer is None:
            return
        step = record.step
        flat: dict[str, float] = {}
        _scalars("", {k: v for k, v in row.items() if k != "step"}, flat)
        for k, v in flat.items():
            self.writer.add_scalar(k, v, step)
        for k, values in (histograms or {}).items():
            if values:
                import numpy as np

                self.writer.add_histogram(k, np.asarray(values, dtype=np.float64), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[StepMetrics]:
    """The run's step records (none when it has no metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [StepMetrics.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
