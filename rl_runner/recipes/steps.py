"""What one GRPO step measures and decides, apart from the loop that calls it
(:mod:`rl_runner.recipes.grpo`): each sample's staleness (version lag, KL to the trainer) and
which samples are admitted, group advantages (a late member scored against every reward its
group trained on), the learning signal, the mismatch probe after a publication, and the step
record written to metrics.jsonl."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.errors import FailureCategory, InfraFailure
from envkit.spec import Task
from rl_runner.batch.assembler import Batch
from rl_runner.distributed.rollouts import Rollouts
from rl_runner.metrics import (
    BatchStats,
    Divergence,
    EnvVersionFailures,
    Failures,
    Mismatch,
    Publish,
    Reward,
    Signal,
    Staleness,
    StepMetrics,
    Throughput,
    TrainStats,
    TrajectoryTimes,
    distribution,
    mean_or_none,
)
from rl_runner.policy.client import PolicyClient, SamplingParams
from rl_runner.policy.router import Router
from rl_runner.publish import PublishResult
from rl_runner.recipes.config import Recipe
from rl_runner.rollout.trajectory import Trajectory, write_jsonl
from rl_runner.trainer.losses import group_advantages
from rl_runner.trainer.trainer import Sample, Trainer

__all__ = ["Refused", "Target", "admit", "batch_stats", "distinct_prompts", "failure_rates", "lag0", "learning_signal",
           "mismatch_probe", "pooled", "step_record", "version_lag", "version_of", "with_advantages"]

EARLIER_GROUPS = 4096  # groups whose rewards are kept for their late members (far more than are ever in flight)

# An environment of the run: its rollouts (this machine's or a Ray cluster's) and its tasks.
Target = tuple[Rollouts, list[Task]]


# -- per-step measurements -------------------------------------------------------------------


def version_of(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        return 0  # vLLM's "default": the starting weights


def version_lag(sample: Sample, current: int) -> int:
    versions = [version_of(v) for v, m in zip(sample.versions, sample.mask, strict=True) if m]
    return current - min(versions) if versions else 0


def failure_rates(trajs: list[Trajectory]) -> Failures:
    n = max(1, len(trajs))
    categories = Counter(t.outcome.category for t in trajs)
    by_env: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_env.setdefault(f"{t.env_ref} {t.image_digest[:19]}", []).append(t)
    return Failures(
        infra=sum(t.excluded for t in trajs) / n, retried=sum(t.retries > 0 for t in trajs) / n,
        model=categories[FailureCategory.MODEL] / n, verifier=categories[FailureCategory.VERIFIER] / n,
        by_env_version={key: EnvVersionFailures(
            episodes=len(ts), retries=sum(t.retries for t in ts),
            infra_failures=sum(t.excluded and t.outcome.category is FailureCategory.INFRA for t in ts),
            # the first attempt failed as infra or verifier, whether a retry then succeeded or not
            first_attempt_failures=sum(bool(t.attempts) or t.outcome.retryable for t in ts))
            for key, ts in by_env.items()})


def distinct_prompts(trajs: list[Trajectory]) -> list[list[int]]:
    prompts: list[list[int]] = []
    for tr in trajs:
        if tr.prompt_token_ids not in prompts:
            prompts.append(tr.prompt_token_ids)
    return prompts


def mismatch_probe(trainer: Trainer, policy: PolicyClient, prompts: list[list[int]], sampling: SamplingParams,
           version: int) -> Mismatch:
    """Fresh generations with the weights just published vs the trainer's log-probs."""
    samples = []
    round_trip = True
    for p in prompts:
        gen = policy.generate(p, sampling)
        if not gen.token_ids:
            continue
        round_trip &= all(v == str(version) for v in gen.weight_versions)
        samples.append(Sample(p, gen.token_ids, [1] * len(gen.token_ids), gen.logprobs, versions=gen.weight_versions))
    div = trainer.divergence(samples, trainer.logprobs(samples)) if samples else []
    both = pooled(div)
    return Mismatch(kl=both.kl, max_abs=both.max_abs, tokens=both.tokens, round_trip_ok=round_trip)


def pooled(div: list[dict[str, float]]) -> Divergence:
    """Per-sample divergences pooled over their tokens: token-weighted KL, worst |Δ log-prob|."""
    div = [d for d in div if d["tokens"]]
    tokens = int(sum(d["tokens"] for d in div))
    if not div:
        return Divergence(kl=None, max_abs=None, tokens=0)
    return Divergence(kl=sum(d["kl"] * d["tokens"] for d in div) / tokens, max_abs=max(d["max_abs"] for d in div),
                      tokens=tokens)


# -- admission, refusal and the step record ----------------------------------------------------


def admit(usable: list[Trajectory], div: list[dict[str, float]], recipe: Recipe,
          earlier: Mapping[str, Sequence[float]] | None = None) -> list[bool]:
    """Which usable samples train: sync admits all (all on-policy); async admits a sample whose
    staleness KL is at most ``async.kl_max`` (not by step count). Then the group rule: a
    sample trains only beside another admitted member of its group, in this batch or (a late
    member of a partial group) in ``earlier`` ones: advantages need two."""
    ok = [True] * len(usable) if recipe.mode == "sync" else [d["kl"] <= recipe.async_.kl_max for d in div]
    groups = [tr.group_id for tr in usable]
    kept = Counter(g for g, a in zip(groups, ok, strict=True) if a)
    earlier = earlier or {}
    return [a and kept[g] + len(earlier.get(g, ())) >= 2 for g, a in zip(groups, ok, strict=True)]


def with_advantages(samples: list[Sample], usable: list[Trajectory], admitted: list[bool],
                    earlier: dict[str, list[float]] | None = None) -> list[Sample]:
    """The admitted samples, each with its group-relative advantage set: the batch to train on.
    ``earlier``: per group, the rewards its members trained on in earlier batches (partial
    groups): a late member is scored against them as well, and its reward is added to them."""
    batch = [sm for sm, a in zip(samples, admitted, strict=True) if a]
    chosen = [tr for tr, a in zip(usable, admitted, strict=True) if a]
    rewards = [float(tr.reward) for tr in chosen]  # type: ignore[arg-type]
    groups = [tr.group_id for tr in chosen]
    advantages = group_advantages(rewards, groups, earlier=earlier)
    for sm, adv in zip(batch, advantages, strict=True):
        sm.advantage = adv
    if earlier is not None:
        for g, r in zip(groups, rewards, strict=True):
            earlier.setdefault(g, []).append(r)
        while len(earlier) > EARLIER_GROUPS:  # insertion order: the oldest groups go first
            del earlier[next(iter(earlier))]
    return batch


@dataclass
class Refused:
    """Batches with nothing to train on since the last step (async: every sample refused as
    stale; or every episode excluded): no optimizer step, no new version. They count in the
    next step's record (its wait, its failure rates, its rejected samples)."""

    batches: int = 0
    samples: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def episodes(self) -> int:
        return len(self.trajectories)

    def add(self, trajs: list[Trajectory], samples: int, *, step: int, run_dir: Path, kl_max: float) -> None:
        """Count a refused batch and keep its trajectories (on disk too). Twenty in a row is
        a failure to report, not a wait."""
        self.batches += 1
        self.samples += samples
        self.trajectories.extend(trajs)
        write_jsonl(run_dir / "trajectories" / f"step-{step:05d}-refused-{self.batches}.jsonl", trajs)
        if self.batches >= 20:
            raise InfraFailure("no_trainable_batch", f"20 batches in a row had nothing to train on before step {step}",
                               outcomes=dict(Counter(tr.outcome for tr in trajs)), kl_max=kl_max)


UNPARSEABLE = "model_failure:unparseable_action"


def learning_signal(trajs: list[Trajectory], usable: list[Trajectory]) -> Signal:
    """The step's :class:`~rl_runner.metrics.Signal`: groups of two or more usable episodes and
    how many of them have rewards that differ, the share of episodes whose actions parsed, and
    the sampled tokens' mean ``-log p``."""
    rewards: dict[str, list[float]] = {}
    for tr in usable:
        rewards.setdefault(str(tr.group_id), []).append(float(tr.reward))  # type: ignore[arg-type]
    groups = [r for r in rewards.values() if len(r) >= 2]
    scored = [tr for tr in trajs if not tr.excluded]
    nlp = [-float(lp) for tr in usable for lp, m in zip(tr.logprobs, tr.loss_mask, strict=False) if m]
    return Signal(groups=len(groups), groups_with_signal=sum(1 for r in groups if max(r) != min(r)),
                  valid_actions=(round(sum(tr.outcome != UNPARSEABLE for tr in scored) / len(scored), 4)
                                 if scored else None),
                  entropy=round(sum(nlp) / len(nlp), 4) if nlp else None)


def step_record(*, step: int, version: int, recipe: Recipe, wall_s: float, ttb_s: float, step_s: float,
                trajs: list[Trajectory], usable: list[Trajectory], env_refs: list[str], batch: BatchStats,
                trainable: int, refused: Refused, div: list[dict[str, float]], lags: list[int], admitted: list[bool],
                mismatch: Mismatch, train: dict[str, Any], publish: PublishResult) -> StepMetrics:
    """The step's line of metrics.jsonl: ``trajs`` the batch's episodes, ``usable`` the ones
    with samples (``div``, ``lags`` and ``admitted`` are per usable sample); ``step_s`` the
    step's whole time, for its throughput."""
    def mean_reward(of: list[Trajectory]) -> float | None:
        return mean_or_none([float(tr.reward) for tr in of])  # type: ignore[arg-type]

    produced = refused.trajectories + trajs
    tokens = sum(tr.generated_tokens for tr in produced)
    throughput = Throughput(step_s=round(step_s, 3), generated_tokens=tokens, trajectories=len(produced),
                            generated_tokens_per_s=round(tokens / step_s, 2) if step_s > 0 else None,
                            trajectories_per_s=round(len(produced) / step_s, 4) if step_s > 0 else None)

    return StepMetrics(
        step=step, version=version, mode=recipe.mode, wall_s=round(wall_s, 3), ttb_s=round(ttb_s, 4),
        episodes=len(trajs), batch=batch, trainable=trainable,
        refused_batches=refused.batches, refused_episodes=refused.episodes,
        reward=Reward(mean=mean_reward(usable),
                      by_env={ref: mean_reward([tr for tr in usable if tr.env_ref == ref]) for ref in env_refs}),
        episode_s=distribution([tr.timings.get("episode_s", 0.0) for tr in trajs]),
        outcomes=dict(Counter(tr.outcome for tr in trajs)),
        failures=failure_rates(refused.trajectories + trajs),
        staleness=Staleness(kl=distribution([d["kl"] for d in div]),
                            lag={str(k): v for k, v in sorted(Counter(lags).items())},
                            admitted=sum(admitted), rejected=len(admitted) - sum(admitted) + refused.samples,
                            kl_max=recipe.async_.kl_max if recipe.mode == "async" else None),
        mismatch=mismatch, mismatch_batch=lag0(div, lags), train=TrainStats(**train),
        signal=learning_signal(trajs, usable),
        publish=Publish(**publish.to_dict()),
        throughput=throughput)


# -- the loop --------------------------------------------------------------------------------


def batch_stats(batch: Batch, router: Router, envs: list[Target]) -> BatchStats:
    """The assembler's figures for this batch (TTB window: the trainer's wait for it), plus
    inference idle share and sandbox utilisation over the same window."""
    spans = [r.occupancy(batch.t_open, batch.t_close) for r, _ in envs]
    held, alive = sum(h for h, _ in spans), sum(a for _, a in spans)
    idle = router.idle_share(batch.t_open, batch.t_close)
    window = dict(batch.stats)
    times = TrajectoryTimes(**window.pop("trajectory_s"))
    return BatchStats(**window, trajectory_s=times, inference_idle_share=round(idle, 4) if idle is not None else None,
                      sandbox_utilisation=round(held / alive, 4) if alive > 0 else None,
                      prefix_hit_rate=router.cache_stats()["prefix_hit_rate"],
                      replica_requests=router.cache_stats()["requests"],
                      sandboxes_created=sum(r.sandbox_stats()["created"] for r, _ in envs),
                      sandboxes_reused=sum(r.sandbox_stats()["reused"] for r, _ in envs))


def lag0(div: list[dict[str, float]], lags: list[int]) -> Divergence:
    """The batch's own samples at lag 0 (all of them in sync mode): their KL to the trainer
    before the update is the numerical mismatch too."""
    return pooled([d for d, lag in zip(div, lags, strict=True) if lag == 0])
