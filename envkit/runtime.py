"""Episodes: the one engine of an episode's lifecycle.

An :class:`EnvRuntime` holds one built environment (its image and sandbox backend); an
:class:`Episode` runs one task on one sandbox:

* ``runtime.start(task, seed, sandboxes)``: a sandbox acquired (from a pool, a fresh one, or
  one the caller holds: a :class:`SandboxSource`), reset to the task's seeded state, the state
  checked; an infra failure here is retried on another sandbox (``retries``), then raised;
* ``episode.act(tool, arguments) -> Observation``: one agent action, under the episode's
  budgets (time, turns, generated tokens via :meth:`Episode.tokens_left`) and its cancel flag;
  a model failure ends the episode and is recorded, never raised;
* ``episode.finish() -> EpisodeResult``: verification with the counterfactual check, the
  outcome by one precedence, the sandbox released (back to its pool when it can serve again).

Every driver (the scripted agents of ``envkit run``/``validate`` and the probes, the Python
API's ``EnvkitEnv.step``, the vLLM agent loop, the batch bench's scripted workload) keeps only
its own decisions: what to do next. Every way an episode can end is classified per
:mod:`envkit.errors`.

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
from pathlib import Path
from typing import Any, Protocol

from envkit.engine import connect
from envkit.errors import EpisodeFailure, InfraFailure, ModelFailure, Outcome, VerifierFailure
from envkit.images import BuildResult
from envkit.kinds import EnvKind, SandboxSpec, kind_of
from envkit.records import EpisodeResult, Observation, StepRecord, VerifyResult
from envkit.sandbox import AGENT, ExecResult, ResetResult, Sandbox, SandboxLimits
from envkit.sandbox.runtimes import choose_runtime
from envkit.spec import LoadedEnvironment, Task
from envkit.tools import TOOL_ARGUMENTS

__all__ = ["MAX_COMMAND_BYTES", "TIME_LIMITS", "TOOL_ARGUMENTS", "EnvRuntime", "Episode", "EpisodeResult",
           "GivenSandbox", "KeptSandbox", "NewSandbox", "Observation", "SandboxSource", "StepRecord", "VerifyResult"]

# The longest command an agent may send (bytes): one argument of an exec is at most 128 KiB on Linux.
MAX_COMMAND_BYTES = 100_000
TIME_LIMITS = ("episode_timeout",)  # model failures that truncate an episode rather than end it
REUSABLE_AFTER = ("unparseable_action", "turn_limit", "token_limit")  # the sandbox is as clean as after an ok episode


class SandboxSource(Protocol):
    """Where an episode's sandbox comes from and goes back to: a warm pool
    (:class:`envkit.sandbox.pool.WarmPool`), a fresh container per episode, or one the caller
    holds. ``reusable``: the episode ended cleanly enough for the sandbox to serve again."""

    def acquire(self) -> Sandbox: ...

    def release(self, sandbox: Sandbox, *, reusable: bool = False) -> None: ...


class NewSandbox:
    """A new sandbox of ``backend`` per episode, destroyed at its end."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def acquire(self) -> Sandbox:
        sandbox: Sandbox = self.backend.create()
        return sandbox

    def release(self, sandbox: Sandbox, *, reusable: bool = False) -> None:
        _destroy(sandbox)


class GivenSandbox:
    """The caller's sandbox: lent to each episode, never destroyed (``envkit validate`` runs
    every agent of a task on one sandbox; a reset restores it)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def acquire(self) -> Sandbox:
        return self.sandbox

    def release(self, sandbox: Sandbox, *, reusable: bool = False) -> None:
        pass


class KeptSandbox:
    """One sandbox of ``backend`` kept from episode to episode (the Python API: every reset
    restores it), replaced only after an infra failure (:meth:`discard`)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.sandbox: Sandbox | None = None

    def acquire(self) -> Sandbox:
        if self.sandbox is None:
            self.sandbox = self.backend.create()
        return self.sandbox

    def release(self, sandbox: Sandbox, *, reusable: bool = False) -> None:
        pass

    def discard(self) -> None:
        self.close()

    def close(self) -> None:
        if self.sandbox is not None:
            _destroy(self.sandbox)
            self.sandbox = None


def _destroy(sandbox: Sandbox) -> None:
    try:
        sandbox.destroy()
    except Exception:  # noqa: BLE001 - a failed cleanup must not hide the episode's result
        pass


class EnvRuntime:
    """A built environment plus the means to run episodes on it (the episode engine: an
    "environment runtime"; not to be confused with its sandboxes' *sandbox runtime*, runc or
    gVisor, which is ``sandbox_runtime`` here and ``limits.runtime`` on every sandbox)."""

    def __init__(self, env: LoadedEnvironment, *, client: Any | None = None, build_result: BuildResult | None = None,
                 backend: Any | None = None, cpuset: str | None = None, sandbox_runtime: str | None = None) -> None:
        """``backend``: where sandboxes come from when not this machine's Docker (a cluster's
        rollout worker passes one that refuses: its sandboxes come from sandbox hosts).
        ``cpuset``: the cores every sandbox is confined to (a runner's CPU partition).
        ``sandbox_runtime``: runc or gvisor as the user asked (``--runtime``); None: as
        :func:`envkit.sandbox.runtimes.choose_runtime` decides (pulled environments under gVisor)."""
        self.env = env
        self.kind: EnvKind = kind_of(env.spec)
        if backend is None and client is None:
            client = connect()
        self.sandbox_runtime = choose_runtime(env.spec.limits.runtime, pulled=env.pulled,
                                              network=env.spec.limits.network,
                                              requested=sandbox_runtime, client=client if backend is None else None)
        self.build = build_result or self.kind.build(env, client=client)
        self.limits = dataclasses.replace(SandboxLimits.from_spec(env.spec.limits), cpuset=cpuset,
                                          runtime=self.sandbox_runtime.runtime)
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
        """An episode on ``sandbox``, not reset yet (tests drive one step by step). ``fresh``
        makes a new sandbox for the counterfactual check (default: this runtime's backend; a
        Ray worker passes its sandbox host's)."""
        return Episode(self, task, seed, sandbox, agent, fresh)

    def start(self, task: Task, seed: int, sandboxes: SandboxSource, *, agent: str = "", retries: int = 0,
              fresh: Callable[[], Sandbox] | None = None, cancel: threading.Event | None = None,
              max_turns: int | None = None) -> Episode:
        """An episode ready to act: a sandbox from ``sandboxes``, reset to the task's seeded
        state and checked. An infra failure on the way releases that sandbox (not reusable)
        and is tried again on another, ``retries`` times, then raised (its ``episode``
        attribute: the episode that failed, when a sandbox was acquired). ``max_turns``: the
        agent's actions (default the spec's); ``cancel``: set by whoever may abort the episode
        (the batch assembler; drivers check :attr:`Episode.cancelled` before each generation)."""
        for attempt in range(retries + 1):
            t0 = time.monotonic()
            try:
                sandbox = sandboxes.acquire()
            except InfraFailure:
                if attempt == retries:
                    raise
                continue
            episode = Episode(self, task, seed, sandbox, agent, fresh, sandboxes=sandboxes, cancel=cancel,
                              max_turns=max_turns)
            episode.timings["sandbox_acquire_s"] = round(time.monotonic() - t0, 4)
            try:
                episode.reset()
                return episode
            except InfraFailure as failure:
                episode.release(reusable=False, broken=True)
                if attempt == retries:
                    failure.episode = episode  # type: ignore[attr-defined]  # for a driver's result
                    raise
            except BaseException:
                episode.release(reusable=False)
                raise
        raise AssertionError("unreachable")


class Episode:
    """One task on one sandbox, from its reset to its result (see the module's docstring)."""

    def __init__(self, runtime: EnvRuntime, task: Task, seed: int, sandbox: Sandbox, agent: str,
                 fresh: Callable[[], Sandbox] | None = None, *, sandboxes: SandboxSource | None = None,
                 cancel: threading.Event | None = None, max_turns: int | None = None) -> None:
        self.runtime = runtime
        self.task = task
        self.seed = seed
        self.sandbox = sandbox
        self.agent = agent
        self.fresh = fresh
        self.sandboxes = sandboxes  # where the sandbox goes back to (None: the caller keeps it)
        self.cancel = cancel
        self.max_turns = max_turns if max_turns is not None else runtime.env.spec.limits.max_turns
        self.turns = 0  # actions taken through act()
        self.generated_tokens = 0  # counted by a model-driven caller (generated())
        self.aborted = False
        self.failure: InfraFailure | VerifierFailure | None = None  # what kept finish() from a reward
        self._released = False
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

    @property
    def root(self) -> Path:
        """The environment's folder (oracles, container tasks' files)."""
        return self.runtime.env.root

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release(reusable=False)  # a no-op after finish() or abort()

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
        own = seconds if result is None else result.own_s
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
        # it could not start: the model's doing, never infra
        if len(command.encode(errors="replace")) > MAX_COMMAND_BYTES:
            self.model_failure = ModelFailure("command_too_long",
                                              f"the command is {len(command.encode(errors='replace'))} "
                                              f"bytes; a command may be at most {MAX_COMMAND_BYTES}")
            raise self.model_failure
        try:
            result = self.sandbox.exec(command, timeout_s=timeout, user=AGENT)
        except ModelFailure as failure:  # e.g. no process can start: the agent filled the pids limit
            self.model_failure = failure
            raise
        self._record(StepRecord(command, result.exit_code, result.stdout, result.stderr, result.duration_s,
                                result.limit_hit))
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
        result = self.sandbox.http(method, path, body)
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
        label = "browser " + " ".join(f"{k}={v!r}" if k != "action" else str(v)
                                      for k, v in action.items() if k != "tool")
        failed = observation.startswith("error:")
        self._record(StepRecord(label, 1 if failed else 0, observation, "", duration, None))
        self.count_command("agent", None, duration)
        return observation

    # -- the agent's side -------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def end(self, failure: ModelFailure) -> None:
        """The agent's episode is over because of ``failure`` (a driver's own finding, e.g. an
        unparseable reply; the first one recorded stands). Verification still decides the reward."""
        if self.model_failure is None:
            self.model_failure = failure

    def tokens_left(self) -> int:
        """How many tokens the agent may still generate (the spec's ``max_generated_tokens``);
        at 0 the episode ends with ``token_limit``."""
        left = int(self.spec.limits.max_generated_tokens) - self.generated_tokens
        if left <= 0:
            self.end(ModelFailure("token_limit", f"the model generated {self.generated_tokens} tokens, the spec allows "
                                                 f"{self.spec.limits.max_generated_tokens}"))
        return max(0, left)

    def generated(self, tokens: int) -> None:
        self.generated_tokens += tokens

    def act(self, tool: str, arguments: dict[str, Any]) -> Observation:
        """One agent action: a tool call by name (``bash``, ``http``, ``browser``, ``answer``;
        see :data:`TOOL_ARGUMENTS`) under the episode's budgets. A model failure ends the
        episode (recorded, given back as an observation: ``terminated``, or ``truncated`` for
        the time limit); so do the last allowed turn (``turn_limit``, truncated) and an answer
        (terminated). Acting on an episode that is over raises its failure. Infra failures
        raise. (The cancel flag is for the driver to check before it generates: an action
        already generated runs.)"""
        if self.model_failure is not None:
            raise self.model_failure
        self.turns += 1
        try:
            text = self.tool(tool, arguments)
        except ModelFailure as failure:  # e.g. no process can start (its own pids), a tool not offered
            self.end(failure)
            return Observation(f"error: {failure.message}", terminated=failure.kind not in TIME_LIMITS,
                               truncated=failure.kind in TIME_LIMITS)
        if tool == "answer":
            return Observation(text, terminated=True)
        if self.model_failure is not None:  # the command ran into the episode's time limit
            kind = self.model_failure.kind
            return Observation(text, terminated=kind not in TIME_LIMITS, truncated=kind in TIME_LIMITS)
        if self.turns >= self.max_turns:
            self.end(ModelFailure("turn_limit", f"the agent used all {self.max_turns} turns"))
            return Observation(text, truncated=True)
        return Observation(text)

    def tool(self, tool: str, arguments: dict[str, Any]) -> str:
        """One tool call by name, as the text an agent observes, outside the turn budget (an
        oracle's replayed actions). Model failures raise (and end the episode where they are
        fatal); so do infra failures."""
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
        """Run the verifier once on ``sandbox`` as it is (the environment kind's way); on the
        episode's own sandbox, what the verdict shows of the agent is the episode's."""
        try:
            verdict = self.runtime.kind.verify(self.runtime.env, self.task, self.seed, sandbox, answer)
        except VerifierFailure as failure:  # its command's own time still counts
            self._count_verifier(getattr(failure, "command_s", 0.0), getattr(failure, "command_cpu_s", 0.0))
            raise
        self._count_verifier(verdict.command_s, verdict.command_cpu_s)
        if sandbox is self.sandbox and verdict.model_failure is not None:
            self.verify_failure = verdict.model_failure
        return verdict

    def _count_verifier(self, seconds: float, cpu_s: float) -> None:
        for key, value in (("verifier_commands_s", seconds), ("verifier_commands_cpu_s", cpu_s)):
            self.timings[key] = round(self.timings.get(key, 0.0) + value, 6)

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
        """The model failure the outcome names (the one precedence): what verification showed,
        else what ended the episode, else a limit a command hit."""
        return self.verify_failure or self.model_failure or self.limit_failure

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, *, verify: bool = True, release: bool = True) -> EpisodeResult:
        """Verify the state the agent left (:meth:`verify`: the counterfactual check included),
        name the outcome and release the sandbox (:attr:`reusable` says how; ``release=False``
        leaves that to the driver, which times the episode first). An infra or verifier
        failure comes back as a result without a reward (and in :attr:`failure`), never
        raised. ``verify=False``: no verifier (the batch bench's scripted workload, which plays
        its verification time as a command)."""
        reward: float | None = None
        details: dict[str, Any] = {}
        try:
            if verify:
                verdict = self.verify()
                reward, details = verdict.reward, verdict.details
        except (InfraFailure, VerifierFailure) as failure:
            self.failure = failure
        except BaseException:
            self.release(reusable=False)
            raise
        result = self.result(reward, self.failure, details)
        if release:
            self.release(reusable=self.reusable, broken=isinstance(self.failure, InfraFailure))
        return result

    @property
    def reusable(self) -> bool:
        """Whether the sandbox can serve another episode: after an ok episode or one that ended
        on the agent's own budget (``REUSABLE_AFTER``); never after an infra or verifier
        failure, a resource limit or a model failure that may have left it unfit."""
        decisive = self.decisive_failure()
        return self.failure is None and (decisive is None or decisive.kind in REUSABLE_AFTER)

    def abort(self) -> None:
        """The episode was cancelled (its batch closed without it): no verification; the
        sandbox goes back to its pool (the next reset restores it)."""
        self.aborted = True
        self.release(reusable=True)

    def release(self, *, reusable: bool, broken: bool = False) -> None:
        """Give the sandbox back (once) and close what the episode holds on the host.
        ``broken``: an infra failure hit it (a kept sandbox is then replaced)."""
        if self._released:
            return
        self._released = True
        self.close()
        if self.sandboxes is not None:
            self.sandboxes.release(self.sandbox, reusable=reusable)
            if broken and isinstance(self.sandboxes, KeptSandbox):
                self.sandboxes.discard()

    def result(self, reward: float | None, failure: EpisodeFailure | None, verifier: dict[str, Any]) -> EpisodeResult:
        decisive = failure or self.decisive_failure()
        outcome: Outcome = decisive.outcome if decisive is not None else Outcome.ok()
        return EpisodeResult(
            env=self.runtime.env.ref, image_id=self.runtime.build.image_id, task_id=self.task.id, seed=self.seed,
            agent=self.agent, reward=reward, outcome=outcome.label, evidence=outcome.evidence,
            state_hash=self.reset_result.state_hash if self.reset_result else "",
            steps=list(self.steps), verifier=verifier, timings=dict(self.timings), runtime=self.runtime.limits.runtime,
        )
