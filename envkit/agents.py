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
from envkit.runtime import EnvRuntime, Episode, EpisodeResult, GivenSandbox, NewSandbox
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
                    "use --agent oracle, --agent null, --agent 'shell:COMMAND' or --agent probe:NAME "
                    "(envkit validate's probes)")


def run_episode(runtime: EnvRuntime, task: Task, seed: int, agent: Agent,
                sandbox: Sandbox | None = None) -> EpisodeResult:
    """Run one episode on a new sandbox (or the caller's ``sandbox``, kept). Infra and verifier
    failures come back as results, never raise."""
    t0 = time.monotonic()
    sandboxes = NewSandbox(runtime.backend) if sandbox is None else GivenSandbox(sandbox)
    try:
        episode = runtime.start(task, seed, sandboxes, agent=agent.name)
    except (InfraFailure, VerifierFailure) as failure:
        failed: Episode | None = getattr(failure, "episode", None)  # the reset failed: its timings and state hash
        result = failed.result(None, failure, {}) if failed is not None else EpisodeResult(
            env=runtime.env.ref, image_id=runtime.build.image_id, task_id=task.id, seed=seed, agent=agent.name,
            reward=None, outcome=failure.outcome.label, evidence=failure.evidence, state_hash="",
            runtime=runtime.limits.runtime)
    else:
        with episode:  # released, whatever happens
            try:
                agent.act(episode)
            except ModelFailure:
                pass  # what the episode recorded stands; the reward still comes from the verifier
            except (InfraFailure, VerifierFailure) as failure:
                episode.failure = failure
            result = episode.finish() if episode.failure is None else episode.result(None, episode.failure, {})
    result.timings["episode_s"] = round(time.monotonic() - t0, 4)
    return result
