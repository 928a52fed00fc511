"""Scripted agents for `envkit run` and `envkit validate`, and the one-episode driver.

* ``oracle``: plays the task's reference solution (its kind's way: :mod:`envkit.kinds`).
* ``null``: does nothing; a sound task must give it reward 0.
* ``shell:CMD``: runs CMD once, as the agent.
* ``probe:NAME``: plays one of ``envkit validate``'s hack probes (:mod:`envkit.probes`).

Model-driven agents (vLLM) live in ``rl_runner``; they drive the same :class:`Episode`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from envkit.errors import InfraFailure, ModelFailure, UserError, VerifierFailure
from envkit.runtime import EnvRuntime, Episode, EpisodeResult
from envkit.sandbox import Sandbox
from envkit.spec import Task

__all__ = ["Agent", "NullAgent", "OracleAgent", "ShellAgent", "parse_agent", "run_episode"]


class Agent(Protocol):
    @property
    def name(self) -> str: ...

    def act(self, episode: Episode) -> None: ...


class NullAgent:
    name = "null"

    def act(self, episode: Episode) -> None:
        return None


class OracleAgent:
    """Runs the task's reference solution, the environment kind's way (:mod:`envkit.kinds`):
    a script run as the agent in the workspace, tool actions replayed through the agent's own
    tools (service environments), or a Harbor task's solution/solve.sh."""

    name = "oracle"

    def act(self, episode: Episode) -> None:
        episode.runtime.kind.play_oracle(episode)


@dataclass
class ShellAgent:
    command: str

    @property
    def name(self) -> str:
        return f"shell:{self.command}"

    def act(self, episode: Episode) -> None:
        episode.step(self.command)


def parse_agent(text: str) -> Agent:
    if text == "oracle":
        return OracleAgent()
    if text == "null":
        return NullAgent()
    if text.startswith("shell:") and text[len("shell:"):].strip():
        return ShellAgent(text[len("shell:"):])
    if text.startswith("probe:"):
        from envkit.probes import PROBES, ProbeAgent

        probes = {p.name: p for p in PROBES}
        if text[len("probe:"):] in probes:
            return ProbeAgent(probes[text[len("probe:"):]])
        raise UserError(f"`{text}` names no probe", f"choose one of: {', '.join(probes)}")
    raise UserError(f"`{text}` is not an agent",
                    "use --agent oracle, --agent null, --agent 'shell:COMMAND' or --agent probe:NAME (envkit validate's probes)")


def run_episode(runtime: EnvRuntime, task: Task, seed: int, agent: Agent, sandbox: Sandbox | None = None) -> EpisodeResult:
    """Run one episode. Infra and verifier failures come back as results, never raise."""
    t0 = time.monotonic()
    result = _run_episode(runtime, task, seed, agent, sandbox)
    result.timings["episode_s"] = round(time.monotonic() - t0, 4)
    return result


def _run_episode(runtime: EnvRuntime, task: Task, seed: int, agent: Agent, sandbox: Sandbox | None) -> EpisodeResult:
    own = sandbox is None
    t0 = time.monotonic()
    episode: Episode | None = None
    try:
        if sandbox is None:
            sandbox = runtime.backend.create()
        acquire_s = round(time.monotonic() - t0, 4)
        episode = runtime.episode(task, seed, sandbox, agent.name)
        episode.timings["sandbox_acquire_s"] = acquire_s
        episode.reset()
        try:
            agent.act(episode)
        except ModelFailure:
            pass  # recorded on the episode; the reward still comes from the verifier
        verdict = episode.verify()
        return episode.result(verdict.reward, None, verdict.details)
    except (InfraFailure, VerifierFailure) as failure:
        if episode is None:
            episode = runtime.episode(task, seed, sandbox, agent.name) if sandbox is not None else None
        if episode is None:
            return EpisodeResult(env=runtime.env.ref, image_id=runtime.build.image_id, task_id=task.id, seed=seed,
                                 agent=agent.name, reward=None, outcome=failure.outcome.label,
                                 evidence=failure.evidence, state_hash="", runtime=runtime.limits.runtime)
        return episode.result(None, failure, {})
    finally:
        if episode is not None:
            episode.close()
        if own and sandbox is not None:
            try:
                sandbox.destroy()
            except Exception:  # noqa: BLE001 - a failed cleanup must not hide the episode's result
                pass
