"""Episodes: reset a sandbox to the task's seeded state, let an agent act, verify.

An :class:`EnvRuntime` holds one built environment (its image and sandbox backend); each
:class:`Episode` runs on one sandbox: ``reset(seed)`` → ``step(command)``… → ``verify()``.
Every way an episode can end is classified per :mod:`envkit.errors`.

Verification decides the reward, and RL optimises what the verifier measures (a forgeable
verifier trains forgers), so it keeps two rules (docs/architecture.md, "Failure attribution"):

* **The trust boundary.** The verifier runs as its own user, which cannot read the agent's
  workspace; in a repository environment the runtime starts the call server as the *agent*
  (``ENVKIT_CALLS``), and hidden tests reach the agent's code only through it, as data
  (``envkit_check``).
* **Counterfactual attribution.** A verifier that times out, crashes or prints no reward on
  the agent's state is asked again on the seeded state of a fresh sandbox. If it works there,
  the agent's state broke it: a model failure with reward 0 (trainable, not retried). If it
  fails there too, it is the environment's failure (``verifier_failure``, excluded). If the
  fresh sandbox itself fails, it is infra. The evidence says which case happened.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from envkit.engine import connect
from envkit.errors import EpisodeFailure, InfraFailure, ModelFailure, Outcome, VerifierFailure
from envkit.images import BuildResult
from envkit.kinds import EnvKind, SandboxSpec, kind_of
from envkit.records import EpisodeResult, StepRecord, VerifyResult
from envkit.sandbox import AGENT, ExecResult, ResetResult, Sandbox, SandboxLimits
from envkit.sandbox.runtimes import choose_runtime
from envkit.spec import LoadedEnvironment, Task
from envkit.tools import TOOL_ARGUMENTS

__all__ = ["MAX_COMMAND_BYTES", "TOOL_ARGUMENTS", "EnvRuntime", "Episode", "EpisodeResult", "StepRecord", "VerifyResult"]

# The longest command an agent may send (bytes): one argument of an exec is at most 128 KiB on Linux.
MAX_COMMAND_BYTES = 100_000


class EnvRuntime:
    """A built environment plus the means to run episodes on it."""

    def __init__(self, env: LoadedEnvironment, *, client: Any | None = None, build_result: BuildResult | None = None,
                 backend: Any | None = None, cpuset: str | None = None, runtime: str | None = None) -> None:
        """``backend``: where sandboxes come from when not this machine's Docker (a cluster's
        rollout worker passes one that refuses: its sandboxes come from sandbox hosts).
        ``cpuset``: the cores every sandbox is confined to (a runner's CPU partition).
        ``runtime``: runc or gvisor as the user asked (``--runtime``); None: as
        :func:`envkit.sandbox.runtimes.choose_runtime` decides (pulled environments under gVisor)."""
        self.env = env
        self.kind: EnvKind = kind_of(env.spec)
        if backend is None and client is None:
            client = connect()
        self.runtime_choice = choose_runtime(env.spec.limits.runtime, pulled=env.pulled, network=env.spec.limits.network,
                                             requested=runtime, client=client if backend is None else None)
        self.build = build_result or self.kind.build(env, client=client)
        self.limits = dataclasses.replace(SandboxLimits.from_spec(env.spec.limits), cpuset=cpuset,
                                          runtime=self.runtime_choice.runtime)
        self._spec = self.kind.sandbox_spec(env, self.build, self.limits, {"org.envkit.env": env.ref})
        self.backend: Any = backend if backend is not None else self._spec.backend(client=client)
        self._first_hash: dict[tuple[int, str], str] = {}
        self._lock = threading.Lock()

    def sandbox_spec(self) -> SandboxSpec:
        """What a sandbox host elsewhere (a Ray node) needs to make this environment's
        sandboxes: the spec this runtime's own backend was made from, with the labels that
        backend puts on them now (tests add theirs)."""
        return dataclasses.replace(self._spec, labels=dict(self.backend.labels))

    def check_reset(self, reset: ResetResult) -> None:
        """Same seed, same state: the first hash seen for a seed is the reference."""
        pinned = self.env.spec.state.repo.commit if self.env.spec.state.repo else None
        if pinned and reset.commit != pinned:
            raise InfraFailure("nondeterministic_reset", "the seeded repository is not at the pinned commit",
                               expected_commit=pinned, got_commit=reset.commit)
        with self._lock:  # a container environment's tasks each have their own state
            first = self._first_hash.setdefault((reset.seed, str(reset.extra.get("task", ""))), reset.state_hash)
        if first != reset.state_hash:
            raise InfraFailure("nondeterministic_reset", f"reset with seed {reset.seed} gave another state",
                               expected_hash=first, got_hash=reset.state_hash)

    def episode(self, task: Task, seed: int, sandbox: Sandbox, agent: str = "",
                fresh: Callable[[], Sandbox] | None = None) -> Episode:
        """An episode on ``sandbox``. ``fresh`` makes a new sandbox for the counterfactual
        check (default: this runtime's backend; a Ray worker passes its sandbox host's)."""
        return Episode(self, task, seed, sandbox, agent, fresh)


class Episode:
    def __init__(self, runtime: EnvRuntime, task: Task, seed: int, sandbox: Sandbox, agent: str,
                 fresh: Callable[[], Sandbox] | None = None) -> None:
        self.runtime = runtime
        self.task = task
        self.seed = seed
        self.sandbox = sandbox
        self.agent = agent
        self.fresh = fresh
        self.steps: list[StepRecord] = []
        self.model_failure: ModelFailure | None = None  # ended the episode
        self.limit_failure: ModelFailure | None = None  # a command hit a limit; the episode went on
        self.verify_failure: ModelFailure | None = None  # verification showed the model's fault (reward stands)
        self.reset_result: ResetResult | None = None
        self.answer_text: str | None = None
        self._browser: Any = None
        self.timings: dict[str, float] = {}
        self._started = 0.0

    @property
    def spec(self) -> Any:
        return self.runtime.env.spec

    def reset(self) -> ResetResult:
        t0 = time.monotonic()
        self.reset_result = self.sandbox.reset(self.seed, task=self.task.id)
        self.runtime.check_reset(self.reset_result)
        self.timings["reset_s"] = round(time.monotonic() - t0, 4)
        self._started = time.monotonic()
        return self.reset_result

    @property
    def time_limit_s(self) -> float:
        """The agent's time for the episode: the spec's, or a container task's own agent timeout."""
        return self.runtime.kind.time_limit_s(self.spec, self.task)

    def _episode_timeout(self) -> ModelFailure:
        return ModelFailure("episode_timeout", f"the episode ran past {self.time_limit_s:g} s")

    def _record(self, step: StepRecord) -> None:
        """Keep a tool step in the trace and add its time to the episode's tool time."""
        self.steps.append(step)
        self.timings["tools_s"] = round(self.timings.get("tools_s", 0.0) + step.duration_s, 4)

    def count_command(self, who: str, result: ExecResult | None, seconds: float = 0.0) -> None:
        """Add the own time and CPU of a command of ``who`` (agent, verifier) to the episode's
        timings (``agent_commands_s``, ``agent_commands_cpu_s``, …): as measured inside the
        sandbox, or ``seconds`` (the host's view) for a tool with no such measure (http, browser)."""
        own = seconds if result is None else (result.command_s if result.command_s is not None else result.duration_s)
        cpu = 0.0 if result is None else (result.command_cpu_s or 0.0)
        for key, value in ((f"{who}_commands_s", own), (f"{who}_commands_cpu_s", cpu)):
            self.timings[key] = round(self.timings.get(key, 0.0) + value, 6)

    def elapsed(self) -> float:
        return time.monotonic() - self._started if self._started else 0.0

    def step(self, command: str) -> ExecResult:
        """Run one agent command; model-caused limits are recorded, infra errors raise."""
        if self.model_failure is not None:
            raise self.model_failure
        left = self.time_limit_s - self.elapsed()
        if left <= 0:
            self.model_failure = self._episode_timeout()
            raise self.model_failure
        timeout = min(self.spec.limits.command_timeout_s, left)
        if len(command.encode(errors="replace")) > MAX_COMMAND_BYTES:  # it could not start: the model's doing, never infra
            self.model_failure = ModelFailure("command_too_long", f"the command is {len(command.encode(errors='replace'))} "
                                              f"bytes; a command may be at most {MAX_COMMAND_BYTES}")
            raise self.model_failure
        try:
            result = self.sandbox.exec(command, timeout_s=timeout, user=AGENT)
        except ModelFailure as failure:  # e.g. no process can start: the agent filled the pids limit
            self.model_failure = failure
            raise
        self._record(StepRecord(command, result.exit_code, result.stdout, result.stderr, result.duration_s, result.limit_hit))
        self.count_command("agent", result)
        if result.limit_hit == "command_timeout" and timeout < self.spec.limits.command_timeout_s:
            self.model_failure = self._episode_timeout()
        elif result.limit_hit is not None:
            # The command hit one of the spec's limits: the model's doing. The episode
            # goes on (the agent sees what happened); the outcome records it.
            self.limit_failure = ModelFailure(result.limit_hit, f"a command hit the spec's {result.limit_hit} limit",
                                           command=command[:500], exit_code=result.exit_code)
        return result

    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """The `http` tool: one request to the environment's service (JSON in and out)."""
        if "http" not in self.spec.tools.enabled:
            raise ModelFailure("tool_not_enabled", "this environment does not offer the http tool")
        if self.elapsed() > self.time_limit_s:
            self.model_failure = self._episode_timeout()
            raise self.model_failure
        t0 = time.monotonic()
        result = self.sandbox.http(method, path, body)  # type: ignore[attr-defined]
        duration = round(time.monotonic() - t0, 4)
        label = f"http {method.upper()} {path}" + (f" {json.dumps(body, sort_keys=True)}" if body is not None else "")
        self._record(StepRecord(label, int(result.get("status", 0)), str(result.get("body", "")),
                                str(result.get("error", "")), duration, None))
        self.count_command("agent", None, duration)
        return result

    def browser(self, action: dict[str, Any]) -> str:
        """The `browser` tool: one action on the service's pages; returns a page snapshot."""
        if "browser" not in self.spec.tools.enabled:
            raise ModelFailure("tool_not_enabled", "this environment does not offer the browser tool")
        if self.elapsed() > self.time_limit_s:
            self.model_failure = self._episode_timeout()
            raise self.model_failure
        from envkit.tools.browser import BrowserSession

        t0 = time.monotonic()
        if self._browser is None:
            self._browser = BrowserSession(self.sandbox)  # type: ignore[arg-type]
        observation = self._browser.act(action)
        duration = round(time.monotonic() - t0, 4)
        label = "browser " + " ".join(f"{k}={v!r}" if k != "action" else str(v) for k, v in action.items() if k != "tool")
        failed = observation.startswith("error:")
        self._record(StepRecord(label, 1 if failed else 0, observation, "", duration, None))
        self.count_command("agent", None, duration)
        return observation

    def act(self, tool: str, arguments: dict[str, Any]) -> str:
        """One tool call by name (``bash``, ``http``, ``browser``, ``answer``; see
        :data:`TOOL_ARGUMENTS`), as the text an agent observes. Model failures raise (and end
        the episode where they are fatal); so do infra failures."""
        if tool == "bash":
            r = self.step(str(arguments["command"]))
            return f"exit {r.exit_code}" + (f" ({r.limit_hit})" if r.limit_hit else "") + f"\n{r.stdout}{r.stderr}"
        if tool == "http":
            return json.dumps(self.http(str(arguments["method"]), str(arguments["path"]), arguments.get("body")))
        if tool == "browser":
            return self.browser(dict(arguments))
        if tool == "answer":
            self.answer(str(arguments["text"]))
            return "answer recorded"
        raise ModelFailure("tool_not_enabled", f"there is no tool {tool!r}")

    def close(self) -> None:
        """Release what the episode holds on the host (the browser)."""
        if self._browser is not None:
            self._browser.close()
            self._browser = None

    def answer(self, text: str) -> None:
        """The `answer` tool: the agent's final answer to a question task (capped at 4 KiB).
        It reaches the verifier as an environment variable, which cannot hold NUL: those are
        dropped (a model's reply can contain any byte)."""
        self.answer_text = str(text).replace("\x00", "")[:4096]
        self.steps.append(StepRecord(f"answer {self.answer_text[:200]}", 0, "", "", 0.0, None))

    def verify(self) -> VerifyResult:
        """The reward of the state the agent left (see the module's docstring for the rules).
        Raises :class:`VerifierFailure` (the environment's) or :class:`InfraFailure`; a
        failure the model caused comes back as reward 0 with ``verify_failure`` set."""
        t0 = time.monotonic()
        try:
            verdict = self._verify_on(self.sandbox, self.answer_text)
        except VerifierFailure as failure:
            verdict = self._counterfactual(failure)
        except ModelFailure as failure:  # the agent's state left no room to start the verifier (pids)
            self.verify_failure = failure
            verdict = VerifyResult(reward=0.0, details={"reward": 0.0, "attribution": "model", **failure.evidence},
                                   duration_s=round(time.monotonic() - t0, 4))
        self.timings["verify_s"] = round(time.monotonic() - t0, 4)
        return verdict

    def _verify_on(self, sandbox: Sandbox, answer: str | None) -> VerifyResult:
        """Run the verifier once on ``sandbox`` as it is (the environment kind's way)."""
        return self.runtime.kind.verify(self, sandbox, answer)

    def _counterfactual(self, failure: VerifierFailure) -> VerifyResult:
        """The verifier failed on the agent's state: does it also fail on the seeded state of a
        fresh sandbox? No: the model's failure (reward 0). Yes: the environment's (raised)."""
        t0 = time.monotonic()
        agent_state = {"outcome": failure.outcome.label, **failure.evidence}
        try:
            sandbox = (self.fresh or self.runtime.backend.create)()
        except EpisodeFailure as e:
            raise InfraFailure("counterfactual_failed", "no fresh sandbox for the counterfactual check",
                               agent_state=agent_state, error=str(e)) from None
        try:
            reset = sandbox.reset(self.seed, task=self.task.id)
            self.runtime.check_reset(reset)
            try:
                seeded = self._verify_on(sandbox, None)
            except VerifierFailure as again:
                seconds = round(time.monotonic() - t0, 4)
                self.timings["counterfactual_s"] = seconds
                evidence = {k: v for k, v in failure.evidence.items() if k != "message"}
                raise VerifierFailure(failure.kind, failure.message + " (and on the seeded state of a fresh sandbox)",
                                      **evidence, attribution="environment", counterfactual_s=seconds,
                                      seeded_state={"outcome": again.outcome.label, **again.evidence}) from None
        except (InfraFailure, ModelFailure) as e:
            raise InfraFailure("counterfactual_failed", "the counterfactual check's fresh sandbox failed",
                               agent_state=agent_state, error=str(e)) from None
        finally:
            try:
                sandbox.destroy()
            except Exception:  # noqa: BLE001 - cleanup must not hide the verdict
                pass
        seconds = round(time.monotonic() - t0, 4)
        self.timings["counterfactual_s"] = seconds
        self.verify_failure = ModelFailure(
            failure.kind, f"{failure.message} on the agent's state, but not on the seeded state of a fresh sandbox: "
            "the agent's state caused it", attribution="model", agent_state=agent_state,
            seeded_state={"reward": seeded.reward}, counterfactual_s=seconds)
        return VerifyResult(reward=0.0, details={"reward": 0.0, "attribution": "model", "agent_state": agent_state,
                                                 "seeded_state_reward": seeded.reward, "counterfactual_s": seconds},
                            duration_s=seconds)

    def decisive_failure(self) -> ModelFailure | None:
        """The model failure the outcome names: what verification showed, else what ended the
        episode, else a limit a command hit."""
        return self.verify_failure or self.model_failure or self.limit_failure

    def result(self, reward: float | None, failure: EpisodeFailure | None, verifier: dict[str, Any]) -> EpisodeResult:
        decisive = failure or self.decisive_failure()
        outcome: Outcome = decisive.outcome if decisive is not None else Outcome.ok()
        return EpisodeResult(
            env=self.runtime.env.ref, image_id=self.runtime.build.image_id, task_id=self.task.id, seed=self.seed,
            agent=self.agent, reward=reward, outcome=outcome.label, evidence=outcome.evidence,
            state_hash=self.reset_result.state_hash if self.reset_result else "",
            steps=list(self.steps), verifier=verifier, timings=dict(self.timings), runtime=self.runtime.limits.runtime,
        )
