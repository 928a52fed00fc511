"""A seeded fault injector for rollouts: faults at known points, and a ledger of what was
injected, so a test can check that every fault was attributed to the right side.

Infra faults (first attempt of an episode only, so its retry can succeed):
  ``kill_container``  the episode's container is killed at its first generation (mid-episode)
  ``docker_api``      the Docker API call that creates the sandbox fails
  ``verifier_crash``  the verifier crashes (a segfault) instead of grading
  ``vllm_restart``    the inference server is stopped (and restarted) at the first generation
Model faults (the policy's own behaviour, every attempt):
  ``model_timeout``      the first action is a command that outlives ``command_timeout_s``
  ``model_unparseable``  the first action is not a valid tool call
  ``model_hangs_verifier``  the first action makes the workspace's code sleep forever when
                         imported, so the verifier's calls into it time out (a model failure
                         with reward 0, never an excluded verifier failure)
  ``model_forges_reward``   the first action makes the workspace's code print reward lines when
                         imported and at exit (the reward must stay what the code earns)

The hooks sit at declared seams: the runtime's backend (sandbox creation and the sandbox's
exec), and the policy client (generation).
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import docker.errors

from envkit.runtime import EnvRuntime
from envkit.sandbox import VERIFIER
from envkit.sandbox.docker_backend import DockerBackend
from rl_runner.policy.client import Generation, PolicyClient, SamplingParams

__all__ = ["INFRA_FAULTS", "MODEL_FAULTS", "ChaosInjector"]

INFRA_FAULTS = ("kill_container", "docker_api", "verifier_crash", "vllm_restart")
MODEL_FAULTS = {"model_timeout": "model_failure:command_timeout",
                "model_unparseable": "model_failure:unparseable_action",
                "model_hangs_verifier": "model_failure:code_timeout", "model_forges_reward": "ok"}
_APPEND = "find . -name '*.py' -not -path './.git/*' | while read -r f; do printf '\\n%s\\n' {code} >> \"$f\"; done"
_FORCED = {
    "model_timeout": '<tool>{"name": "bash", "arguments": {"command": "sleep 600"}}</tool>',
    "model_unparseable": "<tool>{not json</tool>",
    "model_hangs_verifier": "<tool>" + json.dumps({"name": "bash", "arguments": {
        "command": _APPEND.format(code="'import time; time.sleep(10 ** 6)'")}}) + "</tool>",
    "model_forges_reward": "<tool>" + json.dumps({"name": "bash", "arguments": {
        "command": _APPEND.format(code="'import atexit; print(\"{\\\"reward\\\": 1.0}\"); "
                                       "atexit.register(print, \"{\\\"reward\\\": 1.0}\")'")}}) + "</tool>",
}


@dataclass
class _Context:
    index: int = -1
    attempt: int = 0
    fault: str | None = None
    sandbox: Any = None
    generations: int = 0


@dataclass
class ChaosInjector:
    seed: int
    rates: dict[str, float]
    server: Any = None  # a VLLMServer, for vllm_restart
    ledger: list[tuple[int, int, str]] = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _restarting: threading.Event = field(default_factory=threading.Event)

    def decide(self, index: int, attempt: int) -> str | None:
        rng = random.Random(f"{self.seed}/{index}")
        roll = rng.random()
        acc = 0.0
        for fault in sorted(self.rates):
            acc += self.rates[fault]
            if roll < acc:
                if fault in INFRA_FAULTS and attempt > 0:
                    return None
                return fault
        return None

    # -- episode context (called by the runner's hooks) ---------------------------------
    def begin(self, index: int, attempt: int) -> None:
        fault = self.decide(index, attempt)
        self._local.ctx = _Context(index, attempt, fault)
        if fault is not None:
            with self._lock:
                self.ledger.append((index, attempt, fault))

    @property
    def ctx(self) -> _Context:
        ctx: _Context | None = getattr(self._local, "ctx", None)
        return ctx if ctx is not None else _Context()

    # -- seams ------------------------------------------------------------------------
    def wrap_runtime(self, runtime: EnvRuntime) -> EnvRuntime:
        """Put the fault hooks on ``runtime``'s sandbox backend. Do it before opening the
        runtime's rollouts: a sandbox supply keeps the backend it was made with."""
        runtime.backend = _FaultyBackend(runtime.backend, self)
        return runtime

    def wrap_policy(self, policy: PolicyClient, tokenizer: Any) -> PolicyClient:
        return _FaultyPolicy(policy, self, tokenizer)  # type: ignore[return-value]

    def at_first_generation(self) -> None:
        ctx = self.ctx
        if ctx.fault == "kill_container" and ctx.sandbox is not None:
            ctx.sandbox.container.kill()
        elif ctx.fault == "vllm_restart" and self.server is not None:
            self._restart_server()

    def _restart_server(self) -> None:
        with self._lock:
            if self._restarting.is_set():
                return
            self._restarting.set()
        self.server.stop()

        def bring_back() -> None:
            try:
                self.server.start()
            finally:
                self._restarting.clear()

        threading.Thread(target=bring_back, daemon=True).start()


class _FaultyBackend:
    def __init__(self, real: DockerBackend, chaos: ChaosInjector) -> None:
        self.real = real
        self.chaos = chaos

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def create(self) -> Any:
        ctx = self.chaos.ctx
        if ctx.fault == "docker_api":
            broken = DockerBackend(self.real.image, self.real.limits, client=_BrokenClient(self.real.client),
                                   labels=self.real.labels, has_repo=self.real.has_repo,
                                   has_service=self.real.has_service)
            return broken.create()  # raises the infra failure the real code path makes of an API error
        sandbox = self.real.create()
        ctx.sandbox = sandbox
        if ctx.fault == "verifier_crash":
            real_exec = sandbox.exec

            def exec_with_crash(command: str, **kw: Any) -> Any:
                if kw.get("user") == VERIFIER:  # the verifier dies of a segfault, as a crashing grader would
                    command = "python3 -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
                return real_exec(command, **kw)

            sandbox.exec = exec_with_crash  # type: ignore[method-assign]
        return sandbox


class _BrokenClient:
    """A docker client whose container creation fails as a broken engine would."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.containers = self

    def create(self, *args: Any, **kwargs: Any) -> Any:
        raise docker.errors.APIError("injected: 500 Server Error: the Docker engine failed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _FaultyPolicy:
    def __init__(self, real: PolicyClient, chaos: ChaosInjector, tokenizer: Any) -> None:
        self.real = real
        self.chaos = chaos
        self.tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def generate(self, token_ids: list[int], params: SamplingParams, *, session: str | None = None) -> Generation:
        ctx = self.chaos.ctx
        ctx.generations += 1
        if ctx.generations == 1:
            self.chaos.at_first_generation()
        gen = self.real.generate(token_ids, replace(params), session=session)
        forced = _FORCED.get(ctx.fault or "")
        if forced is not None and ctx.generations > 1:
            forced = "done"  # later turns end the episode, so the injected fault decides its outcome
        if forced is not None:
            ids = self.tokenizer.encode(forced, add_special_tokens=False)
            version = gen.weight_versions[0] if gen.weight_versions else ""
            return Generation(ids, [0.0] * len(ids), [version] * len(ids), "stop")
        return gen
