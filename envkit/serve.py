"""`envkit serve`: an environment over OpenEnv's HTTP/WebSocket protocol.

The protocol is OpenEnv's own (the ``openenv-core`` package's server, not a re-implementation):
``/ws`` sessions (reset, step, state), ``/health``, ``/schema``, ``/metadata`` and the
stateless ``/reset`` / ``/step``. Each WebSocket session gets its own :class:`OpenEnvAdapter`,
which drives one :class:`envkit.gym.EnvkitEnv`: one sandbox per session, created at its first
reset and destroyed when the session ends (the client closes or disconnects, or the session
sits idle past ``idle_timeout_s`` and OpenEnv's reaper closes it). Sessions share only the
built image. Any OpenEnv client works, e.g. ``GenericEnvClient(base_url=...).sync()``:

    reset(seed=3, task="fix-median")   -> observation {"text": instruction, "task_id", "seed", ...}
    step({"tool": "bash", "command": "pytest -q"})
    step({"tool": "answer", "text": "42"})   (or {"tool": "submit"}) -> done, reward

The reward is 0 until the episode ends, then the verifier's. A step after the episode ended
(its time or turn limit, an answer) is answered with ``done`` and an error text, not a crash;
an infra failure is an error to the client, never a reward.
"""

from __future__ import annotations

import threading
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, ConcurrencyConfig, EnvironmentMetadata, Observation, State
from pydantic import Field

from envkit.gym import EnvkitEnv, InvalidAction, ResetNeeded
from envkit.runtime import EnvRuntime

__all__ = ["EnvkitAction", "EnvkitObservation", "EnvkitState", "OpenEnvAdapter", "create_app"]


class EnvkitAction(Action):
    """One tool call. ``tool`` defaults to bash; ``arguments`` holds any other tool argument."""

    tool: str = Field(default="bash", description="bash | http | browser | answer | submit (the environment's tools)")
    command: str | None = Field(default=None, description="bash: the command")
    text: str | None = Field(default=None, description="answer: the final answer")
    method: str | None = Field(default=None, description="http: the method")
    path: str | None = Field(default=None, description="http: the path; browser goto: the path")
    body: Any = Field(default=None, description="http: the JSON body")
    action: str | None = Field(default=None, description="browser: the action (read, goto, click, fill, …)")
    arguments: dict[str, Any] = Field(default_factory=dict, description="any other argument of the tool")

    def as_envkit(self) -> dict[str, Any]:
        """The :class:`~envkit.gym.EnvkitEnv` form: ``{"tool": ..., <its arguments>}``."""
        given = {k: getattr(self, k) for k in ("command", "text", "method", "path", "body", "action")
                 if getattr(self, k) is not None}
        return {**self.arguments, **given, "tool": self.tool}


class EnvkitObservation(Observation):
    text: str = Field(default="", description="what the agent sees: the instruction after reset, "
                      "a tool's output after step")
    task_id: str = ""
    seed: int | None = None
    turn: int = 0
    tools: list[str] = Field(default_factory=list)
    outcome: str | None = Field(default=None, description="at the end: ok or model_failure:<kind>")


class EnvkitState(State):
    env: str = ""
    tool_schemas: list[dict[str, Any]] = Field(default_factory=list, description="the environment's tools as "
                                               "OpenAI-style function schemas (for prompting a model with them)")
    task_id: str | None = None
    seed: int | None = None
    state_hash: str | None = None
    sandbox: str | None = None
    running: bool = False


class OpenEnvAdapter(Environment[EnvkitAction, EnvkitObservation, EnvkitState]):
    """One OpenEnv session: an :class:`EnvkitEnv` (and so at most one sandbox) of its own."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, runtime: EnvRuntime, *, task: str | None = None, max_turns: int | None = None) -> None:
        super().__init__()
        self.env = EnvkitEnv(runtime, task=task, max_turns=max_turns)
        self._state = EnvkitState(env=runtime.env.ref, tool_schemas=self.env.tool_schemas)
        self._lock = threading.Lock()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EnvkitObservation:
        with self._lock:
            options = {"task": kwargs["task"]} if kwargs.get("task") else None
            text, info = self.env.reset(seed=seed, options=options)
            self._state = EnvkitState(env=self.env.ref, episode_id=episode_id, step_count=0, task_id=info["task_id"],
                                      seed=info["seed"], state_hash=info["state_hash"],
                                      sandbox=self.env.sandbox_id, running=True, tool_schemas=self.env.tool_schemas)
            return EnvkitObservation(text=text, task_id=info["task_id"], seed=info["seed"], tools=info["tools"],
                                     done=False, reward=0.0, metadata=info)

    def step(self, action: EnvkitAction, timeout_s: float | None = None, **kwargs: Any) -> EnvkitObservation:
        with self._lock:
            st = self._state
            try:
                text, reward, terminated, truncated, info = self.env.step(action.as_envkit())
            except ResetNeeded as e:
                return EnvkitObservation(text=f"error: {e.message}; {e.hint}", task_id=st.task_id or "", seed=st.seed,
                                         done=True, reward=None, metadata={"error": "reset_needed"})
            except InvalidAction as e:  # nothing ran; the episode goes on
                return EnvkitObservation(text=f"error: {e.message}; {e.hint}", task_id=st.task_id or "", seed=st.seed,
                                         turn=st.step_count, done=False, reward=0.0,
                                         metadata={"error": "invalid_action"})
            st.step_count += 1
            done = terminated or truncated
            if done:
                st.running = False
            return EnvkitObservation(text=text, task_id=st.task_id or "", seed=st.seed,
                                     turn=int(info.get("turn") or st.step_count),
                                     outcome=info.get("outcome"), done=done, reward=reward,
                                     metadata={**info, "terminated": terminated, "truncated": truncated})

    @property
    def state(self) -> EnvkitState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        spec = self.env.runtime.env.spec
        return EnvironmentMetadata(name=self.env.ref, description=spec.environment.description
                                   or f"envkit {spec.environment.kind} environment",
                                   version=spec.environment.version, author=None)

    def close(self) -> None:
        with self._lock:
            self.env.close()
            self._state.running = False


def create_app(runtime: EnvRuntime, *, max_sessions: int = 8, idle_timeout_s: float | None = 300,
               task: str | None = None, max_turns: int | None = None) -> Any:
    """The OpenEnv FastAPI app serving ``runtime``'s environment."""
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s)
    return create_fastapi_app(lambda: OpenEnvAdapter(runtime, task=task, max_turns=max_turns), EnvkitAction,
                              EnvkitObservation, concurrency_config=config)
