"""Evaluation: episodes with fixed weights, the mean reward and a 95% confidence interval
(percentile bootstrap over episodes, seeded), overall and per task. Infra-excluded episodes
are left out and counted. ``envkit eval`` and the end of ``envkit train`` use it."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envkit.spec import Task
from rl_runner.distributed.rollouts import Rollouts
from rl_runner.policy.client import SamplingParams
from rl_runner.rollout.runner import EpisodeSpec, run_agent
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["bootstrap_ci", "evaluate", "half_width_needed"]


def bootstrap_ci(values: list[float], *, level: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(values)
    means = sorted(math.fsum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    # The interval holds the sample mean: resampled sums of equal rewards can land an ulp away
    # from fmean (0.7 * 16 / 16 != 0.7), and a plot's error bars must not go negative.
    mean = statistics.fmean(values)
    return (min(lo, mean), max(hi, mean))


def half_width_needed(values: list[float], target: float) -> int | None:
    """Episodes needed for a 95% half-width of ``target`` (normal approximation)."""
    if len(values) < 2:
        return None
    sd = statistics.stdev(values)
    return max(1, int((1.96 * sd / target) ** 2 + 0.999)) if sd > 0 else 1


def evaluate(envs: list[tuple[Rollouts, list[Task]]], *, sampling: SamplingParams, episodes: int, concurrency: int = 8,
             seed: int = 0) -> dict[str, Any]:
    """``episodes`` agent episodes with fixed weights, environments then their tasks round robin,
    each through its environment's rollouts (this machine or a Ray cluster) under the retry rule."""
    specs: list[tuple[int, EpisodeSpec]] = []
    for i in range(episodes):
        k = i % len(envs)
        rollouts, tasks = envs[k]
        task = tasks[(i // len(envs)) % len(tasks)]
        specs.append((k, EpisodeSpec(task, seed + i, f"eval/{rollouts.runtime.env.ref}/{task.id}/{seed + i}")))

    def one(item: tuple[int, EpisodeSpec]) -> Trajectory:
        k, spec = item
        return run_agent(envs[k][0], spec, sampling)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        trajs = list(pool.map(one, specs))
    rewards = [float(t.reward) for t in trajs if not t.excluded and t.reward is not None]
    by_task: dict[str, list[float]] = {}
    for t in trajs:
        if not t.excluded and t.reward is not None:
            by_task.setdefault(f"{t.env_ref}/{t.task_id}", []).append(float(t.reward))
    lo, hi = bootstrap_ci(rewards, seed=seed)
    return {
        "episodes": len(trajs), "scored": len(rewards), "excluded": len(trajs) - len(rewards),
        "mean": statistics.fmean(rewards) if rewards else None, "ci95": [lo, hi],
        "half_width": (hi - lo) / 2 if rewards else None,
        "episodes_for_half_width_0.05": half_width_needed(rewards, 0.05),
        "by_task": {k: {"n": len(v), "mean": statistics.fmean(v), "ci95": list(bootstrap_ci(v, seed=seed))}
                    for k, v in sorted(by_task.items())},
        # where the episodes' sandboxes ran: "local", or the Ray node of their sandbox host
        "sandbox_nodes": dict(Counter(str((t.placement or {}).get("sandbox_node") or "local") for t in trajs)),
    }
