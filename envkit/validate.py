"""`envkit validate`: every task's oracle reaches 1.0, the null agent stays at 0.0, and two
fresh sandboxes reset with the same seed give the same state hash."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.agents import NullAgent, OracleAgent, run_episode
from envkit.errors import EnvkitError
from envkit.runtime import EnvRuntime
from envkit.spec import Task

__all__ = ["TaskCheck", "ValidationReport", "validate"]


@dataclass
class TaskCheck:
    task_id: str
    difficulty: str
    oracle_reward: float | None
    oracle_outcome: str
    null_reward: float | None
    null_outcome: str
    seconds: float
    problems: list[str] = field(default_factory=list)
    episode_seconds: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class ValidationReport:
    env: str
    image_id: str
    tasks: list[TaskCheck]
    determinism: dict[str, Any]
    seconds: float
    reproducible: bool = True  # False: images built from Dockerfiles (container environments)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tasks) and bool(self.determinism.get("ok"))

    def health_figures(self) -> dict[str, Any]:
        """This run's figures in the registry's health-report shape."""
        from envkit.bench import percentile

        outcomes = [o for t in self.tasks for o in (t.oracle_outcome, t.null_outcome) if o]
        infra: dict[str, int] = {}
        for o in outcomes:
            if o.startswith(("infra_failure:", "verifier_failure:")):
                infra[o.split(":", 1)[1]] = infra.get(o.split(":", 1)[1], 0) + 1
        times = [s for t in self.tasks for s in t.episode_seconds if s > 0]
        return {
            "episodes": len(outcomes),
            "infra_failures": infra,
            "model_failures": sum(o.startswith("model_failure:") for o in outcomes),
            "oracle_pass_rate": round(sum(t.oracle_reward == 1.0 for t in self.tasks) / len(self.tasks), 4) if self.tasks else None,
            "p50_episode_s": round(percentile(times, 50), 3) if times else None,
            "p95_episode_s": round(percentile(times, 95), 3) if times else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env, "image_id": self.image_id, "ok": self.ok, "seconds": self.seconds, "reproducible": self.reproducible,
            "tasks": [{**asdict(t), "ok": t.ok} for t in self.tasks], "determinism": self.determinism,
        }


def _check_task(runtime: EnvRuntime, task: Task, seed: int) -> TaskCheck:
    t0 = time.monotonic()
    problems: list[str] = []
    try:
        sandbox = runtime.backend.create()
    except EnvkitError as e:
        return TaskCheck(task.id, task.difficulty, None, "infra_failure:sandbox_start", None, "", 0.0, [f"sandbox: {e}"])
    try:
        oracle = run_episode(runtime, task, seed, OracleAgent(), sandbox)
        null = run_episode(runtime, task, seed, NullAgent(), sandbox)  # same sandbox: reset must restore it
    finally:
        sandbox.destroy()
    if oracle.outcome != "ok" or oracle.reward != 1.0:
        problems.append(f"oracle: reward {oracle.reward} ({oracle.outcome}) {oracle.evidence.get('message', '')}".strip())
    if null.outcome != "ok" or null.reward != 0.0:
        problems.append(f"null: reward {null.reward} ({null.outcome}) {null.evidence.get('message', '')}".strip())
    return TaskCheck(task.id, task.difficulty, oracle.reward, oracle.outcome, null.reward, null.outcome,
                     round(time.monotonic() - t0, 3), problems,
                     [oracle.timings.get("episode_s", 0.0), null.timings.get("episode_s", 0.0)])


def _determinism(runtime: EnvRuntime, seed: int) -> dict[str, Any]:
    hashes = []
    for _ in range(2):
        sandbox = runtime.backend.create()
        try:
            hashes.append(sandbox.reset(seed).state_hash)
        except EnvkitError as e:
            return {"ok": False, "seed": seed, "hashes": hashes, "error": str(e)}
        finally:
            sandbox.destroy()
    return {"ok": len(set(hashes)) == 1, "seed": seed, "hashes": hashes}


def validate(runtime: EnvRuntime, *, seed: int = 0, jobs: int = 2,
             progress: Callable[[TaskCheck], None] | None = None) -> ValidationReport:
    t0 = time.monotonic()
    determinism = _determinism(runtime, seed)
    checks: list[TaskCheck] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for check in pool.map(lambda t: _check_task(runtime, t, seed), runtime.env.tasks):
            checks.append(check)
            if progress is not None:
                progress(check)
    return ValidationReport(runtime.env.ref, runtime.build.image_id, checks, determinism, round(time.monotonic() - t0, 2),
                            reproducible=runtime.build.reproducible)
