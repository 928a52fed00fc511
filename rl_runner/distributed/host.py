"""Sandbox hosts: one Ray actor per sandbox node (a node that advertises the custom resource
``envkit_sandbox_host``) drives *that node's* Docker engine: a warm pool (or fresh containers,
the naive baseline) of the environment's sandboxes, and every sandbox call (exec, files,
reset) of the episodes it serves. A host never reads the environment's files: it gets the
environment kind's picklable sandbox spec (:mod:`envkit.kinds`). Rollout workers see its
sandboxes as :class:`RemoteSandbox` proxies handed out by :class:`HostSandboxes`."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

from envkit.errors import EpisodeFailure, InfraFailure, UserError
from envkit.kinds import SandboxSpec
from envkit.sandbox import ExecResult, ResetResult, Sandbox
from envkit.sandbox.pool import WarmPool
from rl_runner.distributed.replies import HostReply, wall_offset
from rl_runner.rollout.reuse import FreshSandboxes, Sandboxes, sandbox_pool, sandbox_stats

__all__ = ["HOST_LABEL", "RUN_LABEL", "HostSandboxes", "RemoteSandbox", "SandboxHost", "host_call"]

RUN_LABEL = "org.envkit.ray-run"
HOST_LABEL = "org.envkit.ray-host"


class SandboxHost:
    """A node's sandboxes (the Ray actor's class)."""

    def __init__(self, spec: SandboxSpec, run_id: str) -> None:
        import docker.errors
        import ray

        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.host_id = ctx.get_actor_id() or uuid.uuid4().hex
        self.run_id = run_id
        self.backend = spec.backend(labels={RUN_LABEL: run_id, HOST_LABEL: self.host_id})
        for image in spec.images():
            try:
                self.backend.client.images.get(image)
            except docker.errors.ImageNotFound:
                raise UserError(f"the image {image[:19]} is not in the Docker engine of node {socket.gethostname()}",
                                "load it there (the driver's hint says how)") from None
        self.sandboxes: Sandboxes = FreshSandboxes(self.backend)
        self.live: dict[str, tuple[Any, Sandboxes | None]] = {}
        self.lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        return {"host": self.host_id, "node": self.node_id, "hostname": socket.gethostname(), "pid": os.getpid()}

    def configure(self, kind: str, size: int, fill_timeout: float = 0.0) -> None:
        """Start a new sandbox supply: ``pool`` (a reusing warm pool of ``size``) or ``fresh``;
        with ``fill_timeout`` > 0, return once the pool is full (or that many seconds have passed)."""
        old = self.sandboxes
        self.sandboxes = new = sandbox_pool(self.backend, size) if kind == "pool" else FreshSandboxes(self.backend)
        old.close()
        if isinstance(new, WarmPool) and fill_timeout > 0:
            new.wait_ready(timeout=fill_timeout)

    def acquire(self, fresh: bool = False) -> HostReply:
        sandbox: Any
        owner: Sandboxes | None
        try:
            if fresh:  # a retry: a new container, whatever the supply
                sandbox, owner = self.backend.create(), None
            else:
                owner = self.sandboxes
                sandbox = owner.acquire()
        except EpisodeFailure as e:
            return HostReply.failed(e)
        with self.lock:
            self.live[sandbox.id] = (sandbox, owner)
        return HostReply(sandbox.id)

    def call(self, sid: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HostReply:
        with self.lock:
            entry = self.live.get(sid)
        if entry is None:
            return HostReply.failed(InfraFailure("sandbox_lost", f"sandbox {sid[:12]} is not held on this host",
                                                 host=self.host_id))
        try:
            return HostReply(getattr(entry[0], method)(*args, **kwargs))
        except EpisodeFailure as e:
            return HostReply.failed(e)

    def release(self, sid: str, reusable: bool) -> None:
        with self.lock:
            entry = self.live.pop(sid, None)
        if entry is None:
            return
        sandbox, owner = entry
        if owner is not None:
            owner.release(sandbox, reusable=reusable)
        else:
            try:
                sandbox.destroy()
            except Exception:  # noqa: BLE001 - cleanup must not hide the episode's result
                pass

    def occupancy(self, t0_wall: float, t1_wall: float) -> tuple[float, float]:
        """(sandbox-seconds held, sandbox-seconds alive) over a wall-clock window."""
        off = wall_offset()
        s = self.sandboxes
        return s.held.integral(t0_wall - off, t1_wall - off), s.alive.integral(t0_wall - off, t1_wall - off)

    def stats(self) -> dict[str, Any]:
        return sandbox_stats(self.sandboxes)

    def reap(self, live_hosts: list[str]) -> int:
        """Remove this run's containers left by hosts that are gone (same engine only)."""
        gone = 0
        for c in self.backend.client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={self.run_id}"}):
            if c.labels.get(HOST_LABEL) not in live_hosts:
                try:
                    c.remove(force=True)
                    gone += 1
                except Exception:  # noqa: BLE001 - already gone
                    pass
        return gone

    def close(self) -> None:
        self.sandboxes.close()
        with self.lock:
            left = list(self.live)
        for sid in left:
            self.release(sid, False)


def host_call(host: Any, host_id: str, method: str, *args: Any) -> Any:
    """A call to a sandbox host; the host being gone is an infra failure of the episode."""
    import ray

    try:
        return ray.get(getattr(host, method).remote(*args))
    except ray.exceptions.RayActorError as e:
        raise InfraFailure("sandbox_host_lost", "the sandbox host serving this episode is gone", host=host_id,
                           error=type(e).__name__) from None


class RemoteSandbox(Sandbox):
    """A sandbox held by a :class:`SandboxHost`, seen from a rollout worker."""

    def __init__(self, host: Any, sid: str, host_id: str) -> None:
        self.host, self._id, self.host_id = host, sid, host_id

    @property
    def id(self) -> str:
        return self._id

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return host_call(self.host, self.host_id, "call", self._id, method, args, kwargs).unwrap()

    def exec(self, command: str, **kwargs: Any) -> ExecResult:
        return self._call("exec", command, **kwargs)

    def put_file(self, path: str, data: bytes, **kwargs: Any) -> None:
        self._call("put_file", path, data, **kwargs)

    def get_file(self, path: str, **kwargs: Any) -> bytes:
        return self._call("get_file", path, **kwargs)

    def reset(self, seed: int, task: str | None = None) -> ResetResult:
        return self._call("reset", seed, task=task)

    def kill_processes(self, user: str = "agent") -> None:
        self._call("kill_processes", user)

    def start_agent_calls(self) -> str:
        return str(self._call("start_agent_calls"))

    def prepare_verifier(self, clear: tuple[str, ...]) -> bool:
        return bool(self._call("prepare_verifier", clear))

    def put_tree(self, dest: str, files: list[tuple[str, bytes | None, int]]) -> None:
        """A container environment's folder (Harbor tests/, solution/), read on this side."""
        self._call("put_tree", dest, files)

    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return self._call("http", method, path, body)

    def alive(self) -> bool:
        return bool(self._call("alive"))

    def destroy(self) -> None:
        host_call(self.host, self.host_id, "release", self._id, False)


class HostSandboxes:
    """The ``Sandboxes`` an episode function gets on Ray: one host's supply (``fresh``: a new
    container per acquire, for retries)."""

    def __init__(self, host: Any, host_id: str, fresh: bool = False) -> None:
        self.host, self.host_id, self.fresh = host, host_id, fresh

    def acquire(self, timeout: float = 600) -> RemoteSandbox:
        sid = host_call(self.host, self.host_id, "acquire", self.fresh).unwrap()
        return RemoteSandbox(self.host, sid, self.host_id)

    def create_fresh(self) -> RemoteSandbox:
        """A new container on this host, whatever the supply (the counterfactual check's);
        destroying it releases it."""
        sid = host_call(self.host, self.host_id, "acquire", True).unwrap()
        return RemoteSandbox(self.host, sid, self.host_id)

    def release(self, sandbox: RemoteSandbox, *, reusable: bool = False) -> None:
        try:
            host_call(self.host, self.host_id, "release", sandbox.id, reusable)
        except InfraFailure:
            pass  # the host is gone, and its containers with it

    def close(self) -> None:
        pass
