"""Collecting trajectories: concurrent episodes, retries on fresh sandboxes for infra
failures, exclusion with a reason when retries run out, and the group rule."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envkit.errors import parse_outcome
from envkit.runtime import EnvRuntime
from envkit.spec import Task
from rl_runner.metrics import pct
from rl_runner.policy.client import PolicyClient, SamplingParams
from rl_runner.rollout.loop import run_agent_episode
from rl_runner.rollout.retry import run_attempts
from rl_runner.rollout.reuse import Sandboxes
from rl_runner.rollout.trajectory import Trajectory, apply_group_rule

__all__ = ["EpisodeSpec", "collect", "plan", "run_with_retries", "summarize"]


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


def run_with_retries(runtime: EnvRuntime, spec: EpisodeSpec, *, policy: PolicyClient, tokenizer: Any,
                     sampling: SamplingParams, max_retries: int, index: int = 0, on_attempt: Callable[[int, int], None] | None = None,
                     policy_ready: Callable[[], bool] | None = None, ready_timeout_s: float = 300,
                     sandboxes: Sandboxes | None = None, cancel: threading.Event | None = None,
                     session: str | None = None) -> Trajectory:
    """One episode under the retry rule (:mod:`rl_runner.rollout.retry`), each retry on a fresh
    sandbox. ``sandboxes`` lends reusable sandboxes to first attempts. Before retrying an
    ``inference_unavailable`` failure it waits (up to ``ready_timeout_s``) for ``policy_ready``:
    retrying against a server that is down only burns the retry."""
    queued = time.monotonic()

    def attempt(n: int, failed: list[str]) -> Trajectory:
        if failed and parse_outcome(failed[-1]).kind == "inference_unavailable" and policy_ready is not None:
            deadline = time.monotonic() + ready_timeout_s
            while not policy_ready() and time.monotonic() < deadline:
                time.sleep(1.0)
        if on_attempt is not None:
            on_attempt(index, n)
        traj = run_agent_episode(runtime, spec.task, spec.seed, policy=policy, tokenizer=tokenizer, sampling=sampling,
                                 group_id=spec.group_id, sandboxes=sandboxes if n == 0 else None, cancel=cancel,
                                 session=session)
        traj.timings["queue_s"] = round(time.monotonic() - queued - traj.timings.get("episode_s", 0.0), 4)
        return traj

    def describe() -> Trajectory:
        return Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id, task_id=spec.task.id, seed=spec.seed,
                          group_id=spec.group_id)

    return run_attempts(attempt, max_retries=max_retries, describe=describe)


def collect(runtime: EnvRuntime, episodes: list[EpisodeSpec], *, policy: PolicyClient, tokenizer: Any,
            sampling: SamplingParams, concurrency: int = 4, max_retries: int = 2,
            progress: Callable[[Trajectory], None] | None = None, on_attempt: Callable[[int, int], None] | None = None,
            policy_ready: Callable[[], bool] | None = None) -> list[Trajectory]:
    """Run every episode (each exactly once in the result, in plan order). ``on_attempt(i,
    attempt)`` runs before each attempt (the fault injector's hook); ``policy_ready`` is polled
    before retrying an inference failure."""
    results: list[Trajectory | None] = [None] * len(episodes)

    def one(i: int) -> None:
        results[i] = run_with_retries(runtime, episodes[i], policy=policy, tokenizer=tokenizer, sampling=sampling,
                                      max_retries=max_retries, index=i, on_attempt=on_attempt, policy_ready=policy_ready)
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
