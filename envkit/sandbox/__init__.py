"""Sandboxes: where an agent's commands run.

:class:`Sandbox` is the abstract class every backend's sandbox derives from (a backend that
leaves an operation out fails when it is made, not in the middle of an episode); :mod:`envkit.sandbox.docker_backend`
is the Docker backend (its docstring states the threat model), :mod:`envkit.sandbox.container`
the one for container environments (a task's own image), and :mod:`envkit.sandbox.pool` keeps a
warm pool of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.spec import LimitsSection

__all__ = ["AGENT", "VERIFIER", "ExecResult", "ResetResult", "Sandbox", "SandboxLimits"]

AGENT = "agent"
VERIFIER = "verifier"


@dataclass(frozen=True)
class SandboxLimits:
    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    disk_mb: int = 512
    network: str = "none"
    command_timeout_s: float = 60
    output_limit_bytes: int = 65536
    cpuset: str | None = None  # the cores the containers may use ("1", "2-7"): a runner's CPU partition, not the spec's
    runtime: str = "runc"  # runc | gvisor (envkit.sandbox.runtimes chooses: the user's call, not only the spec's)

    @property
    def gvisor(self) -> bool:
        """Under gVisor: some limits are enforced inside the sandbox instead (docs/architecture.md, Runtimes)."""
        return self.runtime == "gvisor"

    @classmethod
    def from_spec(cls, limits: LimitsSection) -> SandboxLimits:
        return cls(
            cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids, disk_mb=limits.disk_mb,
            network=limits.network, command_timeout_s=limits.command_timeout_s,
            output_limit_bytes=limits.output_limit_bytes,
        )


@dataclass(frozen=True)
class ExecResult:
    """What one command did. ``limit_hit`` names the spec limit it ran into, if any."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    oom_killed: bool = False
    pids_limited: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    truncated: bool = False
    # The command's own time and CPU (its processes', reaped), measured inside the sandbox:
    # ``duration_s`` minus ``command_s`` is what running it cost on top. None: not measured.
    command_s: float | None = None
    command_cpu_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit_hit is None

    @property
    def own_s(self) -> float:
        """The command's own time as measured in the sandbox, else as the host saw it."""
        return self.command_s if self.command_s is not None else self.duration_s

    @property
    def limit_hit(self) -> str | None:
        # The first cause wins: a fork bomb that stalls until the timeout is a pids problem.
        if self.oom_killed:
            return "oom"
        if self.pids_limited:
            return "pids_limit"
        if self.timed_out:
            return "command_timeout"
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["limit_hit"] = self.limit_hit
        return d


@dataclass(frozen=True)
class ResetResult:
    state_hash: str
    commit: str
    seed: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


class Sandbox(ABC):
    """One isolated place to run an episode: every operation the episode engine, the kinds'
    verifiers, the pools and the sandbox hosts use. What a sandbox cannot do it says in the
    operation's answer, not by leaving it out: :meth:`http` answers ``{"error"}`` where there is
    no service, :meth:`start_agent_calls` ``unavailable: <why>`` where there is no call server
    (a container environment keeps Harbor's trust model)."""

    @property
    @abstractmethod
    def id(self) -> str: ...

    @abstractmethod
    def exec(self, command: str, *, timeout_s: float | None = None, user: str = AGENT,
             env: dict[str, str] | None = None, workdir: str | None = None) -> ExecResult:
        """Run ``command`` under bash (in ``workdir``, by default the sandbox's working
        folder); never raises for what the command itself did."""
        ...

    @abstractmethod
    def put_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str = AGENT) -> None: ...

    @abstractmethod
    def get_file(self, path: str, *, user: str = AGENT, max_bytes: int = 16 * 1024 * 1024) -> bytes: ...

    @abstractmethod
    def reset(self, seed: int, task: str | None = None) -> ResetResult:
        """Restore the seeded state exactly; returns its state hash. ``task``: the episode's
        task, for sandboxes whose state differs per task (container environments)."""
        ...

    @abstractmethod
    def kill_processes(self, user: str = AGENT) -> None: ...

    @abstractmethod
    def start_agent_calls(self) -> str:
        """Start the agent's call server for a verification (envkit_check); returns its
        socket path, or ``unavailable: <why>``."""
        ...

    @abstractmethod
    def put_tree(self, dest: str, files: list[tuple[str, bytes | None, int]]) -> None:
        """Copy files (relative path, data or None for a folder, mode) under ``dest``, owned by
        root, in one operation."""
        ...

    @abstractmethod
    def prepare_verifier(self, clear: tuple[str, ...]) -> bool:
        """Stop every process of the agent and remove ``clear`` (the verifier's folders), as
        root; False when a folder could not be removed."""
        ...

    @abstractmethod
    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One request to the environment's service from inside the sandbox, as the agent
        (``{"status", "body"}`` or ``{"error"}``); a sandbox without a service says so."""
        ...

    def alive(self) -> bool:
        """Whether the sandbox still runs (a pool's health check before it hands one out)."""
        return True

    @abstractmethod
    def destroy(self) -> None: ...
