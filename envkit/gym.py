"""The Python API: ``envkit.make(ref)``, a :class:`gymnasium.Env`, and ``envkit.check_env(env)``.

    import envkit

    env = envkit.make("envkit/pyfix@1.0.0")          # or a folder
    obs, info = env.reset(seed=3)                     # obs: the task's instruction
    obs, reward, terminated, truncated, info = env.step("pytest -q")
    obs, reward, terminated, truncated, info = env.step({"tool": "answer", "text": "done"})
    env.close()

It is a real Gymnasium environment (``gymnasium.utils.env_checker.check_env`` passes on every
bundled one): text observations and text actions (:class:`TextSpace`: any string up to a
length; samples are short alphanumeric strings), ``reset(seed=, options=)`` seeding
``np_random`` (a reset without a seed draws the episode's seed from it), ``metadata`` without
render modes. ``env.tool_schemas`` lists the environment's tools as OpenAI-style function
schemas (:func:`envkit.tools.tool_schemas`), for prompting a model with them.

Actions: a string is a tool call written as JSON (``{"name": ..., "arguments": {...}}`` or
``{"tool": ..., ...}``) when it parses as one, else a bash command where the environment
offers bash, else the final answer; a dict names a tool and its arguments,
``{"tool": "http", "method": "GET", "path": "/api/orders"}`` (or the runner's own form
``{"name": ..., "arguments": {...}}``); ``{"tool": "answer", "text": ...}`` and
``{"tool": "submit"}`` end the episode. Observations are text, as an agent sees them.
The reward is 0.0 until the episode ends, then the verifier's score. ``terminated``: the agent
ended it (answer, submit) or a model failure made going on impossible; ``truncated``: the
turn limit (``max_turns``, default the spec's) or the episode's time limit. ``info`` carries the
task, seed, state hash, available tools, the turn and, at the end, the outcome (``ok`` or
``model_failure:<kind>``, ``turn_limit`` when the turns ran out) and the verifier's details.
The episode's lifecycle is :class:`envkit.runtime.Episode`'s, as in every other driver.

Infra failures (the sandbox or the engine failing) are not the agent's doing and are raised as
:class:`~envkit.errors.InfraFailure`, never folded into a reward. A sandbox is created on the
first ``reset`` and reused by later resets (a reset restores the seeded state exactly).
"""

from __future__ import annotations

import json
import string
from typing import Any, Literal

import gymnasium

from envkit.errors import EnvkitError, UserError
from envkit.runtime import MAX_COMMAND_BYTES, TOOL_ARGUMENTS, EnvRuntime, Episode, KeptSandbox
from envkit.tools import tool_schemas

__all__ = ["EnvCheckError", "EnvkitEnv", "InvalidAction", "ResetNeeded", "TextSpace", "check_env", "make"]

_MAX_TEXT = 1 << 20  # characters of one observation or action


class TextSpace(gymnasium.spaces.Text):
    """Text of any characters, up to ``max_length``: an agent's observations (a command's
    output, a page) and actions are arbitrary text, so membership does not restrict the
    character set (Gymnasium's Text does, to its ``charset``); samples are drawn from
    ``charset`` (letters, digits, space), as Gymnasium's are."""

    def __init__(self, max_length: int = _MAX_TEXT, *, min_length: int = 1, seed: int | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=string.ascii_letters + string.digits + " ",
                         seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A short random string (at most 32 characters) unless ``mask`` or ``probability`` says
        otherwise: a megabyte of random text is no useful action."""
        if mask is None and probability is None:
            mask = (int(self.np_random.integers(self.min_length, min(self.max_length, 32) + 1)), None)
        return str(super().sample(mask=mask, probability=probability))


class InvalidAction(UserError):
    """The action is not one this environment accepts (nothing ran)."""


class ResetNeeded(UserError):
    """``step`` without a running episode."""


class EnvCheckError(EnvkitError):
    """``check_env`` found the environment breaking the API's contract."""


class EnvkitEnv(gymnasium.Env[str, str | dict[str, Any]]):
    """One environment, one sandbox at a time (see the module's docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(self, runtime: EnvRuntime, *, task: str | None = None, max_turns: int | None = None) -> None:
        self.observation_space = TextSpace(min_length=0)
        self.action_space = TextSpace(MAX_COMMAND_BYTES)
        self.runtime = runtime
        self.task = task
        spec = runtime.env.spec
        self.tools = [t for t in spec.tools.enabled if t in TOOL_ARGUMENTS] + ["answer", "submit"]
        self.max_turns = max_turns or spec.limits.max_turns
        self._sandboxes = KeptSandbox(runtime.backend)
        self._episode: Episode | None = None
        if task is not None:
            self._task(task)

    @property
    def ref(self) -> str:
        return self.runtime.env.ref

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The environment's tools as OpenAI-style function schemas (``submit`` is this API's own)."""
        return tool_schemas(list(self.runtime.env.spec.tools.enabled))

    @property
    def sandbox_id(self) -> str | None:
        """The ID of the sandbox this environment holds (None before the first reset)."""
        sandbox = self._sandboxes.sandbox
        return getattr(sandbox, "id", None) if sandbox is not None else None

    def _task(self, task_id: str) -> Any:
        tasks = {t.id: t for t in self.runtime.env.tasks}
        if task_id not in tasks:
            raise UserError(f"{self.ref} has no task {task_id!r}", f"choose among: {', '.join(sorted(tasks))}")
        return tasks[task_id]

    # -- the Gymnasium calls ---------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: ``options={"task": ID}`` picks the task (else the one given to
        ``make``, else task ``seed mod n``); ``seed=None`` draws one from ``np_random`` (seeded
        by the last seed given, as in Gymnasium)."""
        options = options or {}
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise UserError(f"seed must be a non-negative integer, not {seed!r}", "pass seed=0, 1, 2, …")
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        task_id = options.get("task", self.task)
        tasks = self.runtime.env.tasks
        task = self._task(task_id) if task_id is not None else tasks[seed % len(tasks)]
        self._end_episode()
        # a broken sandbox is replaced once
        episode = self.runtime.start(task, seed, self._sandboxes, agent="python", retries=1, max_turns=self.max_turns)
        self._episode = episode
        assert episode.reset_result is not None
        info = {"env": self.ref, "task_id": task.id, "seed": seed, "state_hash": episode.reset_result.state_hash,
                "tools": list(self.tools), "max_turns": self.max_turns}
        return task.instruction, info

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode = self._episode
        if episode is None:
            raise ResetNeeded("no episode is running (it ended, or reset() was never called)", "call env.reset() first")
        tool, args = self._parse(action)
        if tool == "submit":
            return self._finish("", terminated=True, info={"turn": episode.turns + 1})
        obs = episode.act(tool, args)
        info: dict[str, Any] = {"turn": episode.turns}
        if obs.over:
            return self._finish(obs.text, terminated=obs.terminated, info=info)
        return obs.text, 0.0, False, False, info

    def close(self) -> None:
        self._end_episode()
        self._sandboxes.close()

    def __enter__(self) -> EnvkitEnv:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False  # exceptions propagate

    # -- internals ---------------------------------------------------------------------------
    def _parse(self, action: Any) -> tuple[str, dict[str, Any]]:
        if isinstance(action, str):
            if action.lstrip().startswith("{"):
                try:
                    parsed = json.loads(action)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict) and ("tool" in parsed or "name" in parsed):
                    return self._parse(parsed)
            if "bash" in self.tools:
                return "bash", {"command": action}
            return "answer", {"text": action}
        if not isinstance(action, dict):
            raise InvalidAction(f"an action is a string or a dict, not {type(action).__name__}",
                                'e.g. "ls" or {"tool": "answer", "text": "..."}')
        if "name" in action and isinstance(action.get("arguments", {}), dict) and "tool" not in action:
            tool, args = action["name"], dict(action.get("arguments", {}))
        else:
            tool, args = action.get("tool"), {k: v for k, v in action.items() if k != "tool"}
        if tool not in self.tools:
            raise InvalidAction(f"unknown tool {tool!r} for {self.ref}", f"choose among: {', '.join(self.tools)}")
        missing = [a for a in TOOL_ARGUMENTS.get(tool, ()) if a not in args]
        if missing:
            raise InvalidAction(f"tool {tool} needs {', '.join(missing)}", f"e.g. {{'tool': {tool!r}, "
                                + ", ".join(f"{a!r}: ..." for a in TOOL_ARGUMENTS[tool]) + "}")
        return tool, args

    def _finish(self, obs: str, *, terminated: bool,
                info: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode = self._episode
        assert episode is not None
        self._episode = None
        result = episode.finish()
        if episode.failure is not None:  # not the agent's doing: raised, never folded into a reward
            raise episode.failure
        assert result.reward is not None
        info.update(outcome=result.outcome, verifier=result.verifier)
        return obs, float(result.reward), terminated, not terminated, info

    def _end_episode(self) -> None:
        """An episode left unfinished (a new reset, close): its sandbox stays for the next one."""
        if self._episode is not None:
            self._episode.release(reusable=True)
            self._episode = None


def make(ref: str, *, task: str | None = None, max_turns: int | None = None) -> EnvkitEnv:
    """An environment by folder or ref (``ns/name@version``: found locally or pulled from the
    registry you are logged in to); its image is built if missing (reproducibly)."""
    from envkit.catalog import resolve_environment

    return EnvkitEnv(EnvRuntime(resolve_environment(ref)), task=task, max_turns=max_turns)


def _probe_action(env: EnvkitEnv) -> dict[str, Any]:
    """A harmless first action with the environment's first real tool."""
    if "bash" in env.tools:
        return {"tool": "bash", "command": "true"}
    if "http" in env.tools:
        return {"tool": "http", "method": "GET", "path": "/"}
    if "browser" in env.tools:
        return {"tool": "browser", "action": "read"}
    return {}


def check_env(env: EnvkitEnv, *, seed: int = 0) -> dict[str, Any]:
    """Check ``env`` against this API's contract (the shapes and types of ``reset`` and
    ``step``, seeded resets, how episodes end, refusals). Returns the checks passed; raises
    :class:`EnvCheckError` listing every one that failed. Runs a few short episodes."""
    passed: list[str] = []
    failed: list[str] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        (passed if ok else failed).append(name if ok else f"{name}: {detail}")

    obs, info = env.reset(seed=seed)
    check("reset returns (str, dict)", isinstance(obs, str) and isinstance(info, dict),
          f"got {type(obs)}, {type(info)}")
    check("reset info names task, seed, state hash",
          {"task_id", "seed", "state_hash", "tools"} <= set(info) and info.get("seed") == seed,
          f"info keys {sorted(info)}")
    obs2, info2 = env.reset(seed=seed)
    check("same seed, same first observation and state",
          obs2 == obs and info2.get("state_hash") == info.get("state_hash"),
          f"{info.get('state_hash')} then {info2.get('state_hash')}")
    probe = _probe_action(env)
    if probe:
        out = env.step(probe)
        check("step returns (str, float, bool, bool, dict)",
              len(out) == 5 and isinstance(out[0], str) and isinstance(out[1], float) and isinstance(out[2], bool)
              and isinstance(out[3], bool) and isinstance(out[4], dict), f"got {[type(x).__name__ for x in out]}")
        check("no reward before the episode ends", out[1] == 0.0 and not out[2] and not out[3], f"got {out[1:4]}")
    try:
        env.step(12345)  # type: ignore[arg-type]
        check("an invalid action is refused", False, "it was accepted")
    except InvalidAction:
        check("an invalid action is refused", True)
    end = env.step({"tool": "answer", "text": ""})
    check("answer ends the episode with a reward in [0, 1]",
          end[2] is True and end[3] is False and isinstance(end[1], float) and 0.0 <= end[1] <= 1.0, f"got {end[1:4]}")
    check("the end says its outcome", "outcome" in end[4], f"info keys {sorted(end[4])}")
    try:
        env.step({"tool": "answer", "text": ""})
        check("step after the end asks for reset", False, "it was accepted")
    except ResetNeeded:
        check("step after the end asks for reset", True)
    obs3, info3 = env.reset()
    check("reset without a seed draws one", isinstance(info3.get("seed"), int), f"seed {info3.get('seed')!r}")
    if probe:  # the turn limit, with a limit of 2 for the check
        limit, env.max_turns = env.max_turns, 2
        try:
            env.reset(seed=seed)
            first, last = env.step(probe), env.step(probe)
        finally:
            env.max_turns = limit
        check("the turn limit truncates", not (first[2] or first[3]) and last[3] is True and last[2] is False,
              f"got {first[1:4]} then {last[1:4]}")
    if failed:
        raise EnvCheckError(f"{env.ref} breaks the API in {len(failed)} check(s): " + "; ".join(failed))
    return {"env": env.ref, "passed": passed}
