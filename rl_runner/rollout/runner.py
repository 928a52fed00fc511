"""Collecting trajectories with the model-driven agent, through the rollout seam
(:mod:`rl_runner.distributed.rollouts`): :func:`run_agent` is the one way an agent episode is
run (training, evaluation and ``envkit rollout`` call it); :func:`collect` runs many at once,
each exactly once in the result, then applies the group rule."""

from __future__ import annotations

import statistics
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envkit.runtime import EnvRuntime
from envkit.spec import Task
from rl_runner.distributed.rollouts import Rollouts
from rl_runner.metrics import pct
from rl_runner.policy.client import SamplingParams
from rl_runner.rollout.loop import agent_episode
from rl_runner.rollout.trajectory import Trajectory, apply_group_rule

__all__ = ["EpisodeSpec", "collect", "plan", "run_agent", "summarize"]


@dataclass(frozen=True)
class EpisodeSpec:
    task: Task
    seed: int
    group_id: str


def plan(runtime: EnvRuntime, n: int, *, group_size: int = 1, seed: int = 0) -> list[EpisodeSpec]:
    """``n`` episodes over the environment's tasks, round robin, in groups of ``group_size``
    (same task and seed: a GRPO group)."""
    tasks = list(runtime.env.tasks)
    out = []
    for i in range(n):
        g = i // group_size
        task = tasks[g % len(tasks)]
        out.append(EpisodeSpec(task, seed + g, f"{task.id}/{seed + g}"))
    return out


def run_agent(rollouts: Rollouts, spec: EpisodeSpec, sampling: SamplingParams, *, session: str | None = None,
              cancel: threading.Event | None = None, on_attempt: Callable[[int], None] | None = None) -> Trajectory:
    """One agent episode under the retry rule, on ``rollouts``' sandboxes and policy."""
    runtime = rollouts.runtime

    def describe() -> Trajectory:
        return Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id,
                          bundle_digest=runtime.build.bundle_digest, runtime=runtime.limits.runtime,
                          task_id=spec.task.id, seed=spec.seed, group_id=spec.group_id)

    return rollouts.run(agent_episode, {"task_id": spec.task.id, "seed": spec.seed, "group_id": spec.group_id,
                                        "sampling": sampling},
                        session=session or spec.group_id, cancel=cancel or threading.Event(), describe=describe,
                        on_attempt=on_attempt)


def collect(rollouts: Rollouts, episodes: list[EpisodeSpec], *, sampling: SamplingParams, concurrency: int = 4,
            progress: Callable[[Trajectory], None] | None = None,
            on_attempt: Callable[[int, int], None] | None = None) -> list[Trajectory]:
    """Run every episode (each exactly once in the result, in plan order). ``on_attempt(i,
    attempt)`` runs before each attempt of episode ``i`` (the fault injector's hook)."""
    results: list[Trajectory | None] = [None] * len(episodes)

    def one(i: int) -> None:
        hook = (lambda n: on_attempt(i, n)) if on_attempt is not None else None
        results[i] = run_agent(rollouts, episodes[i], sampling, session=f"{episodes[i].group_id}/{i}", on_attempt=hook)
        if progress is not None:
            progress(results[i])  # type: ignore[arg-type]

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        list(pool.map(one, range(len(episodes))))
    done = [r for r in results if r is not None]
    assert len(done) == len(episodes)
    return apply_group_rule(done)


def summarize(trajectories: list[Trajectory], wall_s: float) -> dict[str, Any]:
    times = [t.timings.get("episode_s", 0.0) for t in trajectories if not t.excluded]
    rewards = [t.reward for t in trajectories if t.reward is not None and not t.excluded]
    generated = sum(t.generated_tokens for t in trajectories)
    gen_s = sum(t.timings.get("generation_s", 0.0) for t in trajectories)
    return {
        "episodes": len(trajectories),
        "outcomes": dict(Counter(t.outcome for t in trajectories).most_common()),
        "excluded": sum(t.excluded for t in trajectories),
        "retries": sum(t.retries for t in trajectories),
        "mean_reward": round(statistics.fmean(rewards), 4) if rewards else None,
        "episode_s": {"p50": pct(times, 50), "p90": pct(times, 90), "p99": pct(times, 99)},
        "generated_tokens": generated,
        "generation_tokens_per_s": round(generated / wall_s, 1) if wall_s > 0 else None,
        "generation_tokens_per_generation_s": round(generated / gen_s, 1) if gen_s > 0 else None,
        "trajectories_per_s": round(len(trajectories) / wall_s, 3) if wall_s > 0 else None,
        "wall_s": round(wall_s, 2),
    }
