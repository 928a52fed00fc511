"""`envkit validate`: every task's oracle reaches 1.0, the null agent stays at 0.0, no hack
probe beats any task (:mod:`envkit.probes`), and two fresh sandboxes reset with the same seed
give the same state hash."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.agents import NullAgent, OracleAgent, run_episode
from envkit.errors import EnvkitError, FailureCategory, parse_outcome
from envkit.probes import Probe, ProbeResult, probe_set, run_probe, skipped
from envkit.runtime import EnvRuntime
from envkit.sandbox import Sandbox
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
    probes: list[ProbeResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def beaten_by(self) -> list[str]:
        return [p.probe for p in self.probes if p.beaten]


@dataclass
class ValidationReport:
    env: str
    image_id: str
    tasks: list[TaskCheck]
    determinism: dict[str, Any]
    seconds: float
    reproducible: bool = True  # False: images built from Dockerfiles (container environments)
    probe_set: str = "none"
    probes_run: list[str] = field(default_factory=list)
    probes_skipped: dict[str, str] = field(default_factory=dict)  # probe -> why it does not apply
    runtime: str = "runc"  # the sandboxes' OCI runtime (runc | gvisor)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tasks) and bool(self.determinism.get("ok"))

    def beaten(self) -> dict[str, list[str]]:
        """probe -> the tasks it beat."""
        out: dict[str, list[str]] = {}
        for t in self.tasks:
            for name in t.beaten_by:
                out.setdefault(name, []).append(t.task_id)
        return out

    def probe_summary(self) -> dict[str, Any]:
        return {"set": self.probe_set, "run": list(self.probes_run), "skipped": dict(self.probes_skipped),
                "episodes": sum(len(t.probes) for t in self.tasks), "beaten": self.beaten()}

    def health_figures(self) -> dict[str, Any]:
        """This run's figures in the registry's health-report shape."""
        from envkit.stats import percentile

        outcomes = [parse_outcome(o) for t in self.tasks for o in (t.oracle_outcome, t.null_outcome) if o]
        infra: dict[str, int] = {}
        for o in outcomes:
            if o.category is FailureCategory.INFRA:
                infra[o.kind] = infra.get(o.kind, 0) + 1
        times = [s for t in self.tasks for s in t.episode_seconds if s > 0]
        figures: dict[str, Any] = {
            "episodes": len(outcomes),
            "infra_failures": infra,
            "model_failures": sum(o.category is FailureCategory.MODEL for o in outcomes),
            "verifier_failures": sum(o.category is FailureCategory.VERIFIER for o in outcomes),
            "run": f"envkit validate {self.env} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
            "oracle_pass_rate": (round(sum(t.oracle_reward == 1.0 for t in self.tasks) / len(self.tasks), 4)
                                 if self.tasks else None),
            "p50_episode_s": round(percentile(times, 50), 3) if times else None,
            "p95_episode_s": round(percentile(times, 95), 3) if times else None,
        }
        if self.probe_set != "none":
            figures["probes"] = ({k: v for k, v in self.probe_summary().items() if k != "run"}
                                 | {"tasks": len(self.tasks)})
        return figures

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env, "image_id": self.image_id, "runtime": self.runtime, "ok": self.ok, "seconds": self.seconds,
            "reproducible": self.reproducible,
            "tasks": [{**asdict(t), "ok": t.ok} for t in self.tasks], "determinism": self.determinism,
            "probes": self.probe_summary(),
        }


def _check_task(runtime: EnvRuntime, task: Task, seed: int, probes: list[Probe]) -> TaskCheck:
    t0 = time.monotonic()
    problems: list[str] = []
    try:
        sandbox = runtime.backend.create()
    except EnvkitError as e:
        return TaskCheck(task.id, task.difficulty, None, "infra_failure:sandbox_start", None, "", 0.0,
                         [f"sandbox: {e}"])
    try:
        oracle = run_episode(runtime, task, seed, OracleAgent(), sandbox)
        null = run_episode(runtime, task, seed, NullAgent(), sandbox)  # same sandbox: reset must restore it
    finally:
        _destroy(sandbox)
    if oracle.outcome != "ok" or oracle.reward != 1.0:
        problems.append(f"oracle: reward {oracle.reward} ({oracle.outcome}) "
                        f"{oracle.evidence.get('message', '')}".strip())
    if null.outcome != "ok" or null.reward != 0.0:
        problems.append(f"null: reward {null.reward} ({null.outcome}) {null.evidence.get('message', '')}".strip())
    results = _probe_task(runtime, task, seed, probes, null.reward, problems)
    return TaskCheck(task.id, task.difficulty, oracle.reward, oracle.outcome, null.reward, null.outcome,
                     round(time.monotonic() - t0, 3), problems,
                     [oracle.timings.get("episode_s", 0.0), null.timings.get("episode_s", 0.0)], results)


def _probe_task(runtime: EnvRuntime, task: Task, seed: int, probes: list[Probe], null_reward: float | None,
                problems: list[str]) -> list[ProbeResult]:
    """Each probe on the task, one after the other on one sandbox (a new one after a probe
    that beat the task or broke its sandbox)."""
    results: list[ProbeResult] = []
    sandbox: Sandbox | None = None
    try:
        for probe in probes:
            if sandbox is None:
                sandbox = runtime.backend.create()
            result = run_probe(runtime, task, seed, probe, sandbox, null_reward, run_episode)
            # a broken sandbox: one more try on a fresh one
            if parse_outcome(result.outcome).category is FailureCategory.INFRA:
                _destroy(sandbox)
                sandbox = runtime.backend.create()
                result = run_probe(runtime, task, seed, probe, sandbox, null_reward, run_episode)
            results.append(result)
            if result.beaten:
                problems.append(f"probe {probe.name} beat it: {result.why}")
                _destroy(sandbox)
                sandbox = None
    except EnvkitError as e:
        problems.append(f"probes could not run: {e}")
    finally:
        if sandbox is not None:
            _destroy(sandbox)
    return results


def _destroy(sandbox: Sandbox) -> None:
    try:
        sandbox.destroy()
    except Exception:  # noqa: BLE001 - already gone
        pass


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


def validate(runtime: EnvRuntime, *, seed: int = 0, jobs: int = 2, probes: str = "quick",
             tasks: list[str] | None = None, sample: int | None = None,
             progress: Callable[[TaskCheck], None] | None = None) -> ValidationReport:
    """Check every task (or those named in ``tasks``, or a random ``sample`` of that many,
    drawn with ``seed``) with the oracle, the null agent and the probes of the set ``probes``
    (``none``, ``quick``, ``all``)."""
    t0 = time.monotonic()
    chosen = probe_set(probes)
    tools = [str(t) for t in runtime.env.spec.tools.enabled]
    skip = skipped(chosen, tools)
    playing = [p for p in chosen if p.name not in skip]
    task_list = [runtime.env.task(t) for t in tasks] if tasks else list(runtime.env.tasks)
    if sample is not None and sample < len(task_list):
        picked = set(random.Random(seed).sample(range(len(task_list)), sample))
        task_list = [t for i, t in enumerate(task_list) if i in picked]
    determinism = _determinism(runtime, seed)
    checks: list[TaskCheck] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for check in pool.map(lambda t: _check_task(runtime, t, seed, playing), task_list):
            checks.append(check)
            if progress is not None:
                progress(check)
    return ValidationReport(runtime.env.ref, runtime.build.image_id, checks, determinism,
                            round(time.monotonic() - t0, 2), reproducible=runtime.build.reproducible, probe_set=probes,
                            probes_run=[p.name for p in playing], probes_skipped=skip, runtime=runtime.limits.runtime)
