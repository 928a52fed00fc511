"""Rollout workers: threaded Ray actors (no CPU reserved: they wait on HTTP and on sandbox
calls), spread over the cluster by Ray's scheduler. A worker runs episode functions: generation
goes straight to the vLLM replicas (its own session-affine router, which records each request
for the driver), tool calls go to the sandbox host it was given."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from envkit.errors import EpisodeFailure
from envkit.images import BuildResult
from envkit.runtime import EnvRuntime
from envkit.sandbox import SandboxLimits
from envkit.spec import LoadedEnvironment
from rl_runner.distributed.context import EpisodeContext
from rl_runner.distributed.host import HostSandboxes
from rl_runner.distributed.replies import Failure, WorkerReply
from rl_runner.policy.client import PolicyClient
from rl_runner.policy.router import Router
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["RolloutWorker"]


class _NoLocalSandboxes:
    """A worker's runtime makes no sandboxes of its own: they come from the hosts."""

    def __init__(self, image: str, limits: SandboxLimits) -> None:
        self.image, self.limits = image, limits
        self.labels: dict[str, str] = {}

    def create(self) -> Any:
        raise RuntimeError("on the Ray backend, sandboxes come from sandbox hosts (use ctx.sandboxes)")


class RolloutWorker:
    """Runs episode functions (the Ray actor's class)."""

    def __init__(self, env: LoadedEnvironment, build: BuildResult, urls: list[str], affinity: bool,
                 setup: Callable[[], Any] | None = None, sandbox_runtime: str | None = None) -> None:
        """``sandbox_runtime``: the driver's (its sandbox hosts' sandboxes run under it), so that
        every trajectory records the runtime it ran under."""
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        limits = SandboxLimits.from_spec(env.spec.limits)
        self.runtime = EnvRuntime(env, build_result=build, backend=_NoLocalSandboxes(build.image_id, limits),
                                  sandbox_runtime=sandbox_runtime)
        self.router = Router([PolicyClient(u) for u in urls], affinity=affinity, record=True)
        self.extra = setup() if setup is not None else None
        self.cancels: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def ready(self) -> str:
        return str(self.node_id)

    def run(self, fn: Callable[..., Trajectory], kwargs: dict[str, Any], host: Any, host_id: str, session: str,
            attempt: int) -> WorkerReply:
        cancel = threading.Event()
        with self.lock:
            self.cancels[session] = cancel
        ctx = EpisodeContext(self.runtime, self.router, HostSandboxes(host, host_id, fresh=attempt > 0), cancel,
                             session, self.extra, attempt)
        traj: Trajectory | None = None
        failure: Failure | None = None
        try:
            traj = fn(ctx, **kwargs)
        except EpisodeFailure as e:
            failure = Failure.of(e)
        finally:
            with self.lock:
                self.cancels.pop(session, None)
            events = self.router.take_events(session)
        return WorkerReply(traj, failure, str(self.node_id), events)

    def cancel(self, session: str) -> None:
        with self.lock:
            ev = self.cancels.get(session)
        if ev is not None:
            ev.set()
