"""Environment kinds: one strategy object per kind owns everything that differs between kinds,
so the runtime, the agents and the Ray backend hold no ``if kind == …`` of their own.

=========  =============================  ==========================  =================================
kind       build                          sandbox and reset           verification and oracle
=========  =============================  ==========================  =================================
repo       the bundle as one layer on     :class:`DockerSandbox`:     the verifier user runs the spec's
api        the envkit base (reproducible;  whole-sandbox reset as      command; in a repository the call
website    :func:`envkit.images.           root, the repository and/   server (``ENVKIT_CALLS``) lets hidden
           build_image`)                  or the service's database   tests call the agent's code as data;
                                          restored                    the oracle is a script or replayed
                                                                      tool actions
container  each task's Dockerfile (not    :class:`ContainerSandbox`:  Harbor's phase: tests/ copied in after
           reproducible; :func:`envkit.   a fresh container of the    the agent, test.sh writes reward.txt
           container_images.build_         task's image per reset      or reward.json; the oracle is
           container_env`)                                            solution/solve.sh
=========  =============================  ==========================  =================================

Each kind also makes the *sandbox spec*: a small picklable value (the image IDs, the limits,
the labels) from which any process, a Ray sandbox host on another node included, makes the
environment's sandbox backend (``spec.backend()``) without reading the environment's files,
except a container environment, whose tasks' settings travel with it.

:func:`kind_of` gives an environment's kind object; :func:`build` builds any environment.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from envkit.bundle import Bundle
from envkit.errors import ModelFailure, UserError, VerifierFailure
from envkit.images import BuildResult
from envkit.records import VerifyResult
from envkit.sandbox import AGENT, VERIFIER, ExecResult, SandboxLimits
from envkit.sandbox.container import ContainerBackend
from envkit.sandbox.docker_backend import DockerBackend
from envkit.spec import SOLVE, EnvSpec, LoadedEnvironment, Task
from envkit.tools import TOOL_ARGUMENTS

__all__ = ["KINDS", "ContainerKind", "ContainerSandboxSpec", "EnvKind", "ImageKind", "ImageSandboxSpec", "SandboxSpec",
           "build", "kind_of"]

ORACLE_PATH = "/tmp/envkit-oracle.sh"  # an image environment's oracle script, as the agent sees it
ORACLE_PATCH = "/tmp/envkit-oracle.diff"  # or its patch


class Player(Protocol):
    """What an oracle plays through: an episode's task, environment folder, sandbox and the
    agent's own tools (:class:`envkit.runtime.Episode`)."""

    task: Task
    sandbox: Any

    @property
    def root(self) -> Path: ...

    def step(self, command: str) -> ExecResult: ...

    def tool(self, tool: str, arguments: dict[str, Any]) -> str: ...


# -- sandbox specs: picklable, enough to make sandboxes anywhere ------------------------------

@dataclass(frozen=True)
class ImageSandboxSpec:
    """An envkit-image environment's sandboxes: its image (by ID, already in the engine that
    runs them), limits, labels and what its reset restores."""

    image_id: str
    limits: SandboxLimits
    labels: dict[str, str]
    has_repo: bool
    has_service: bool
    scrub: bool

    missing_image_hint = "envkit build the environment there, or load its image by digest"

    def images(self) -> list[str]:
        return [self.image_id]

    def backend(self, *, client: Any | None = None, labels: dict[str, str] | None = None) -> DockerBackend:
        return DockerBackend(self.image_id, self.limits, client=client, labels={**self.labels, **(labels or {})},
                             has_repo=self.has_repo, has_service=self.has_service, scrub=self.scrub)


@dataclass(frozen=True)
class ContainerSandboxSpec:
    """A container environment's sandboxes: every task's image and the task list (their
    container settings: user, working folder, limits)."""

    env: LoadedEnvironment
    task_images: dict[str, str]
    limits: SandboxLimits
    labels: dict[str, str]

    missing_image_hint = ("`docker save` every task image here and `docker load` them there (a container environment's "
                          "builds are not reproducible)")

    def images(self) -> list[str]:
        return sorted(set(self.task_images.values()))

    def backend(self, *, client: Any | None = None, labels: dict[str, str] | None = None) -> ContainerBackend:
        return ContainerBackend(self.env, self.task_images, self.limits, client=client,
                                labels={**self.labels, **(labels or {})})


SandboxSpec = ImageSandboxSpec | ContainerSandboxSpec


class EnvKind(Protocol):
    """What differs between environment kinds."""

    name: str
    reproducible: bool  # the same folder always gives the same image ID

    def build(self, env: LoadedEnvironment, *, client: Any | None = None, write_lock: bool = True,
              check_recorded: bool = False) -> BuildResult: ...

    def sandbox_spec(self, env: LoadedEnvironment, build: BuildResult, limits: SandboxLimits,
                     labels: dict[str, str]) -> SandboxSpec: ...

    def time_limit_s(self, spec: EnvSpec, task: Task) -> float: ...

    def publish_identity(self, env: LoadedEnvironment, bundle: Bundle, *, oci: str | None) -> tuple[str, str]:
        """(image ID, base) a publication of ``bundle`` records; builds what it needs."""

    def verify(self, env: LoadedEnvironment, task: Task, seed: int, sandbox: Any, answer: str | None) -> VerifyResult:
        """Run the verifier once on ``sandbox`` as it is: the verdict, or VerifierFailure."""

    def play_oracle(self, episode: Player) -> None: ...


# -- repo, api, website: the envkit image ---------------------------------------------------

class ImageKind:
    """repo, api and website environments: one reproducible image holds every task's seeded
    state (a repository, a service and its database); the sandbox restores it in place."""

    reproducible = True

    def __init__(self, name: str) -> None:
        self.name = name

    def build(self, env: LoadedEnvironment, *, client: Any | None = None, write_lock: bool = True,
              check_recorded: bool = False) -> BuildResult:
        from envkit.images import build_image

        return build_image(env, client=client, write_lock=write_lock)  # reproducible: nothing recorded to check

    def sandbox_spec(self, env: LoadedEnvironment, build: BuildResult, limits: SandboxLimits,
                     labels: dict[str, str]) -> ImageSandboxSpec:
        state = env.spec.state
        return ImageSandboxSpec(build.image_id, limits, dict(labels), has_repo=state.repo is not None,
                                has_service=state.service is not None, scrub="bash" in env.spec.tools.enabled)

    def time_limit_s(self, spec: EnvSpec, task: Task) -> float:
        return float(spec.limits.episode_timeout_s)

    def publish_identity(self, env: LoadedEnvironment, bundle: Bundle, *, oci: str | None) -> tuple[str, str]:
        from envkit.images import build_from_bundle

        image_id, base_ref, _cached = build_from_bundle(bundle, env.spec)  # exactly the bundle being published
        return image_id, base_ref

    def verify(self, env: LoadedEnvironment, task: Task, seed: int, sandbox: Any, answer: str | None) -> VerifyResult:
        """Run the spec's verifier once on ``sandbox`` as it is, as the verifier user, after
        every process of the agent's is killed."""
        spec = env.spec
        t0 = time.monotonic()
        sandbox.kill_processes(AGENT)  # nothing of the agent's runs during grading
        variables = {"ENVKIT_TASK_ID": task.id, "ENVKIT_TASK_PARAMS": json.dumps(task.params, sort_keys=True),
               "ENVKIT_SEED": str(seed), "ENVKIT_WORKSPACE": "/workspace"}
        if spec.state.repo is not None:
            variables["ENVKIT_CALLS"] = (sandbox.start_agent_calls() if spec.verifier.calls
                                   else "unavailable: envkit.toml says [verifier] calls = false")
        if answer is not None:
            variables["ENVKIT_ANSWER"] = answer
        vspec = spec.verifier
        res = sandbox.exec(vspec.command, timeout_s=vspec.timeout_s, user=VERIFIER, env=variables, workdir="/env")
        with _counted(res):  # a failure carries the command's own time too
            duration = round(time.monotonic() - t0, 4)
            tail = res.stderr[-2000:]
            if res.timed_out:
                raise VerifierFailure("verifier_timeout", f"the verifier ran past {vspec.timeout_s:g} s",
                                      stderr_tail=tail)
            if res.exit_code != 0 or res.oom_killed:
                raise VerifierFailure("verifier_crash", f"the verifier exited with {res.exit_code}", stderr_tail=tail)
            lines = res.stdout.strip().splitlines()
            try:
                details = json.loads(lines[-1])
                reward = float(details["reward"])
            except (IndexError, ValueError, KeyError, TypeError):
                raise VerifierFailure("bad_output", "the verifier's last stdout line is not {\"reward\": <number>}",
                                      stdout_tail=res.stdout[-500:], stderr_tail=tail) from None
            if not 0.0 <= reward <= 1.0:
                raise VerifierFailure("bad_output", f"the verifier's reward {reward} is outside [0, 1]")
            code = details.get("agent_code") if isinstance(details, dict) else None
            failure = None
            if isinstance(code, dict) and int(code.get("timeouts") or 0) > 0:
                failure = ModelFailure("code_timeout", "the agent's code ran past its time limit "
                                       f"{int(code['timeouts'])} time(s) while the verifier called it",
                                       timeouts=int(code["timeouts"]), reward=reward)
            return VerifyResult(reward=reward, details=details, duration_s=duration, model_failure=failure,
                                command_s=res.own_s, command_cpu_s=res.command_cpu_s or 0.0)

    def play_oracle(self, episode: Player) -> None:
        """A shell script run as the agent in the workspace, or a JSON list of tool actions
        replayed through the agent's own tools:
        ``{"actions": [{"tool": "http", "method", "path", "body"}, {"tool": "answer", "text"}]}``.
        An argument written ``{"from_bash": COMMAND}`` is what COMMAND prints (stripped), run as
        the agent first, in the trace like any step: an answer that depends on the seeded state.
        A ``.diff`` oracle is a patch applied in the workspace (``git apply``, as the agent)."""
        path = episode.root / episode.task.oracle
        if path.suffix == ".json":
            for action in json.loads(path.read_text())["actions"]:
                tool = action.get("tool")
                if tool not in TOOL_ARGUMENTS:
                    raise UserError(f"oracle action with unknown tool {tool!r}", "use http, browser, answer or bash")
                args = {k: episode.step(str(v["from_bash"])).stdout.strip()
                        if isinstance(v, dict) and set(v) == {"from_bash"}
                        else v for k, v in action.items() if k != "tool"}
                episode.tool(str(tool), args)
            return
        if path.suffix == ".diff":
            episode.sandbox.put_file(ORACLE_PATCH, path.read_bytes(), mode=0o644)
            episode.step(f"cd /workspace && git apply --whitespace=nowarn {ORACLE_PATCH} && rm -f {ORACLE_PATCH}")
            return
        episode.sandbox.put_file(ORACLE_PATH, path.read_bytes(), mode=0o755)
        episode.step(f"bash {ORACLE_PATH}")


@contextmanager
def _counted(res: ExecResult) -> Iterator[None]:
    try:
        yield
    except VerifierFailure as failure:
        failure.command_s = res.own_s  # type: ignore[attr-defined]
        failure.command_cpu_s = res.command_cpu_s or 0.0  # type: ignore[attr-defined]
        raise


# -- container: imported Harbor tasks ------------------------------------------------------

def _files(folder: Path) -> list[tuple[str, bytes | None, int]]:
    return [(str(p.relative_to(folder)), p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()]


def harbor_reward(rewards: dict[str, Any]) -> float:
    """A Harbor reward.json's reward: its ``reward`` key if present, else the mean of its keys."""
    if "reward" in rewards:
        return float(rewards["reward"])
    values = [float(v) for v in rewards.values()]
    return sum(values) / len(values)


class ContainerKind:
    """Imported Harbor tasks: each task's own image (built from its Dockerfile), a fresh
    container of it per reset, and Harbor's verifier phase (docs/harbor.md)."""

    name = "container"
    reproducible = False

    def build(self, env: LoadedEnvironment, *, client: Any | None = None, write_lock: bool = True,
              check_recorded: bool = False) -> BuildResult:
        from envkit.container_images import build_container_env

        return build_container_env(env, client=client, write_lock=write_lock, check_recorded=check_recorded)

    def sandbox_spec(self, env: LoadedEnvironment, build: BuildResult, limits: SandboxLimits,
                     labels: dict[str, str]) -> ContainerSandboxSpec:
        return ContainerSandboxSpec(env, dict(build.task_images), limits, dict(labels))

    def time_limit_s(self, spec: EnvSpec, task: Task) -> float:
        assert task.container is not None
        return float(task.container.agent_timeout_s)

    def publish_identity(self, env: LoadedEnvironment, bundle: Bundle, *, oci: str | None) -> tuple[str, str]:
        """The digest of the task images' set (not reproducible: pulls rebuild them)."""
        from envkit.container_images import build_container_images, image_set_digest

        if oci:
            raise UserError("--oci pushes one image; a container environment has one image per task",
                            "publish without --oci (pulls rebuild the tasks' images from their Dockerfiles)")
        return image_set_digest(build_container_images(env)), "dockerfile"

    def verify(self, env: LoadedEnvironment, task: Task, seed: int, sandbox: Any, answer: str | None) -> VerifyResult:
        """Harbor's verifier phase: stop the agent, copy tests/ to /tests, run test.sh (as the
        task's verifier user, in the image's working folder, with [verifier] env), read
        /logs/verifier/reward.json (several keys: ``reward`` if present, else their mean) or
        reward.txt. test.sh's exit code does not matter when it wrote a reward, as in Harbor."""
        c = task.container
        assert c is not None
        t0 = time.monotonic()
        # One exec: the agent's processes killed, /tests and /logs/verifier removed (nothing the
        # agent left there is read as the tests' or the verifier's); then one copy, no exec.
        if not sandbox.prepare_verifier(("/tests", "/logs/verifier")):
            raise VerifierFailure("verifier_setup", "could not remove /tests or /logs/verifier before the tests")
        tests = [(f"tests/{rel}", data, mode) for rel, data, mode in _files(env.root / c.path / "tests")]
        sandbox.put_tree("/", [("logs/verifier", None, 0o777), *tests])
        variables = {**c.verifier_env, "ENVKIT_TASK_ID": task.id, "ENVKIT_SEED": str(seed)}
        res = sandbox.exec(env.spec.verifier.command, timeout_s=c.verifier_timeout_s, user=VERIFIER, env=variables)
        with _counted(res):  # a failure carries the command's own time too
            duration = round(time.monotonic() - t0, 4)
            tail = (res.stdout + res.stderr)[-2000:]
            if res.timed_out:
                raise VerifierFailure("verifier_timeout", f"tests/test.sh ran past {c.verifier_timeout_s:g} s",
                                      output_tail=tail)
            rewards, source = self._rewards(sandbox, res.exit_code, tail)
            bad = {k: v for k, v in rewards.items() if isinstance(v, bool) or not isinstance(v, (int, float))
                   or not math.isfinite(float(v)) or not 0.0 <= float(v) <= 1.0}
            if bad:
                raise VerifierFailure("bad_output", f"{source} has values outside [0, 1] or not numbers: {bad}",
                                      output_tail=tail)
            reward = harbor_reward(rewards)
            details = {"reward": reward, "rewards": rewards, "reward_file": source, "test_exit_code": res.exit_code}
            return VerifyResult(reward=reward, details=details, duration_s=duration, command_s=res.own_s,
                                command_cpu_s=res.command_cpu_s or 0.0)

    @staticmethod
    def _rewards(sandbox: Any, exit_code: int, tail: str) -> tuple[dict[str, Any], str]:
        try:
            raw = sandbox.get_file("/logs/verifier/reward.json", max_bytes=1 << 20)
        except FileNotFoundError:
            try:
                text = sandbox.get_file("/logs/verifier/reward.txt", max_bytes=4096).decode(errors="replace").strip()
            except FileNotFoundError:
                raise VerifierFailure("bad_output", f"tests/test.sh (exit {exit_code}) wrote neither "
                                                    "/logs/verifier/reward.txt nor reward.json",
                                      output_tail=tail) from None
            try:
                return {"reward": float(text)}, "reward.txt"
            except ValueError:
                raise VerifierFailure("bad_output", f"reward.txt holds {text[:80]!r}, not a number",
                                      output_tail=tail) from None
        try:
            rewards = json.loads(raw)
        except ValueError:
            raise VerifierFailure("bad_output", "/logs/verifier/reward.json is not JSON", output_tail=tail) from None
        if not isinstance(rewards, dict) or not rewards:
            raise VerifierFailure("bad_output", "reward.json must be an object of named numbers, e.g. {\"reward\": 1}",
                                  output_tail=tail)
        return rewards, "reward.json"

    def play_oracle(self, episode: Player) -> None:
        """The task's solution/ reaches /solution (for the oracle only) and solve.sh runs there."""
        c = episode.task.container
        assert c is not None
        episode.sandbox.put_tree("/solution", _files(episode.root / c.path / "solution"))
        episode.step(f"bash /solution/{SOLVE}")


KINDS: dict[str, EnvKind] = {"repo": ImageKind("repo"), "api": ImageKind("api"), "website": ImageKind("website"),
                             "container": ContainerKind()}


def kind_of(spec: EnvSpec) -> EnvKind:
    return KINDS[spec.environment.kind]


def build(env: LoadedEnvironment, *, client: Any | None = None, write_lock: bool = True,
          check_recorded: bool = False) -> BuildResult:
    """Build any environment (its kind's way) and write ``envkit.lock``. ``check_recorded``:
    fail when a rebuilt non-reproducible image differs from the lock's."""
    return kind_of(env.spec).build(env, client=client, write_lock=write_lock, check_recorded=check_recorded)
