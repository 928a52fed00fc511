"""The runner on a Ray cluster: sandbox hosts on CPU nodes, rollout workers scheduled by Ray,
vLLM replicas as separate servers.

- :class:`SandboxHost` — one Ray actor per node that advertises the custom resource
  ``envkit_sandbox_host`` (``ray start … --resources '{"envkit_sandbox_host": 1}'``). It
  drives *that node's* Docker engine: a warm pool (or fresh containers, the naive baseline)
  of the environment's image, and every sandbox call (exec, files, reset) of the episodes it
  serves. Sandbox capacity is the number of such nodes times the pool size per host, chosen
  apart from inference.
- :class:`RolloutWorker` — threaded Ray actors (no CPU reserved: they wait on HTTP and on
  sandbox calls), spread over the cluster by Ray's scheduler. A worker runs the agent loop of
  an episode: generation goes straight to the vLLM replicas (its own session-affine
  :class:`~rl_runner.policy.router.Router`), tool calls go to the sandbox host it was given.
- :class:`RayRollouts` — the driver side. ``run(fn, kwargs, session=, cancel=)`` runs one
  episode attempt after another until one is not an infra failure: it picks the least busy
  live host and worker, waits, and on an infra failure retries on a *different* host (when
  one is left). A sandbox host that dies mid-episode (node lost, actor killed) turns that
  episode's next sandbox call into ``infra_failure:sandbox_host_lost``; the host is marked
  dead, its episodes are retried elsewhere, and its containers are removed by a live host
  that shares its engine (a lost node takes its containers with it; a host killed on a node
  that stays up leaves them, labelled with the run, until removed by hand). Each
  episode's result is returned exactly once, with ``retries`` and the failed ``attempts``.

Episode functions are module-level callables ``fn(ctx: EpisodeContext, **kwargs) ->
Trajectory`` (pickled by reference: every node must have envkit installed). They take their
sandboxes from ``ctx.sandboxes`` only.

Clocks: figures that combine several processes (inference occupancy, sandbox occupancy) travel
as wall-clock times and are converted to the driver's monotonic clock on arrival; across
machines they are as good as the nodes' clock synchronisation.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.errors import EpisodeFailure, FailureCategory, InfraFailure, ModelFailure, UserError, VerifierFailure, format_outcome
from envkit.images import BuildResult
from envkit.runtime import EnvRuntime
from envkit.sandbox import ExecResult, ResetResult, SandboxLimits
from envkit.sandbox.docker_backend import DockerBackend
from envkit.spec import LoadedEnvironment
from rl_runner.distributed.local import EpisodeContext, split
from rl_runner.policy.client import PolicyClient
from rl_runner.policy.router import Router
from rl_runner.rollout.retry import StopRetrying, failure_record, run_attempts
from rl_runner.rollout.reuse import FreshSandboxes, Sandboxes, sandbox_pool, sandbox_stats
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["HOST_RESOURCE", "LocalRayCluster", "RayRollouts", "RolloutWorker", "SandboxHost",
           "require_ray"]

HOST_RESOURCE = "envkit_sandbox_host"
HOST_SHARE = 0.01  # of a node's HOST_RESOURCE taken by one environment's host
RUN_LABEL = "org.envkit.ray-run"
HOST_LABEL = "org.envkit.ray-host"
_FAILURES = {c.value: cls for c, cls in ((FailureCategory.INFRA, InfraFailure), (FailureCategory.MODEL, ModelFailure),
                                         (FailureCategory.VERIFIER, VerifierFailure))}


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("the Ray backend needs the `ray` package, which is not installed",
                        "install it: pip install 'envkit[ray]' (scripts/setup.sh does)") from None
    return ray


def _err(e: EpisodeFailure) -> tuple[Any, ...]:
    return ("err", e.category.value, e.kind, e.message, e.evidence)


def _raise(reply: tuple[Any, ...]) -> Any:
    if reply[0] == "ok":
        return reply[1]
    _, category, kind, message, evidence = reply
    evidence = {k: v for k, v in evidence.items() if k != "message"}
    raise _FAILURES[category](kind, message, **evidence)


def _wall_offset() -> float:
    """wall clock − monotonic clock, in this process now."""
    return time.time() - time.monotonic()


# --- sandbox hosts ----------------------------------------------------------------------

@dataclass(frozen=True)
class SandboxSpec:
    """What a host needs to make sandboxes of an environment: its image (by ID, already in
    the node's engine) and limits; for a container environment, every task's image and the
    task list (their container settings). Hosts never read the environment's files."""

    image_id: str
    limits: SandboxLimits
    labels: dict[str, str]
    has_repo: bool
    has_service: bool
    container_env: LoadedEnvironment | None = None
    task_images: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, runtime: EnvRuntime) -> SandboxSpec:
        b = runtime.backend
        if runtime.container:
            return cls(b.image, b.limits, dict(b.labels), False, False, container_env=runtime.env,
                       task_images=dict(runtime.build.task_images))
        return cls(b.image, b.limits, dict(b.labels), b.has_repo, b.has_service)

    def images(self) -> list[str]:
        return sorted(set(self.task_images.values())) if self.container_env is not None else [self.image_id]

    def backend(self, labels: dict[str, str]) -> Any:
        if self.container_env is not None:
            from envkit.sandbox.container import ContainerBackend

            return ContainerBackend(self.container_env, self.task_images, self.limits, labels={**self.labels, **labels})
        return DockerBackend(self.image_id, self.limits, labels={**self.labels, **labels}, has_repo=self.has_repo,
                             has_service=self.has_service)


class SandboxHost:
    """A node's sandboxes (the Ray actor's class; see the module's docstring)."""

    def __init__(self, spec: SandboxSpec, run_id: str) -> None:
        import docker.errors
        import ray

        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.host_id = ctx.get_actor_id() or uuid.uuid4().hex
        self.run_id = run_id
        self.backend = spec.backend({RUN_LABEL: run_id, HOST_LABEL: self.host_id})
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

    def configure(self, kind: str, size: int) -> None:
        """Start a new sandbox supply: ``pool`` (a reusing warm pool of ``size``) or ``fresh``."""
        old = self.sandboxes
        self.sandboxes = sandbox_pool(self.backend, size) if kind == "pool" else FreshSandboxes(self.backend)
        old.close()

    def acquire(self, fresh: bool = False) -> tuple[Any, ...]:
        sandbox: Any
        owner: Sandboxes | None
        try:
            if fresh:  # a retry: a new container, whatever the supply
                sandbox, owner = self.backend.create(), None
            else:
                owner = self.sandboxes
                sandbox = owner.acquire()
        except EpisodeFailure as e:
            return _err(e)
        with self.lock:
            self.live[sandbox.id] = (sandbox, owner)
        return ("ok", sandbox.id)

    def call(self, sid: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        with self.lock:
            entry = self.live.get(sid)
        if entry is None:
            return _err(InfraFailure("sandbox_lost", f"sandbox {sid[:12]} is not held on this host", host=self.host_id))
        try:
            return ("ok", getattr(entry[0], method)(*args, **kwargs))
        except EpisodeFailure as e:
            return _err(e)

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
        off = _wall_offset()
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


class RemoteSandbox:
    """A sandbox held by a :class:`SandboxHost`, seen from a rollout worker."""

    def __init__(self, host: Any, sid: str, host_id: str) -> None:
        self.host, self._id, self.host_id = host, sid, host_id

    @property
    def id(self) -> str:
        return self._id

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _raise(_host_call(self.host, self.host_id, "call", self._id, method, args, kwargs))

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

    def put_tree(self, dest: str, files: list[tuple[str, bytes, int]]) -> None:
        """A container environment's folder (Harbor tests/, solution/), read on this side."""
        self._call("put_tree", dest, files)

    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return self._call("http", method, path, body)

    def alive(self) -> bool:
        return bool(self._call("alive"))

    def destroy(self) -> None:
        _host_call(self.host, self.host_id, "release", self._id, False)


def _host_call(host: Any, host_id: str, method: str, *args: Any) -> Any:
    """A call to a sandbox host; the host being gone is an infra failure of the episode."""
    import ray

    try:
        return ray.get(getattr(host, method).remote(*args))
    except ray.exceptions.RayActorError as e:
        raise InfraFailure("sandbox_host_lost", "the sandbox host serving this episode is gone", host=host_id,
                           error=type(e).__name__) from None


class HostSandboxes:
    """The ``Sandboxes`` an episode function gets on Ray: one host's supply (``fresh``: a new
    container per acquire, for retries)."""

    def __init__(self, host: Any, host_id: str, fresh: bool = False) -> None:
        self.host, self.host_id, self.fresh = host, host_id, fresh

    def acquire(self, timeout: float = 600) -> RemoteSandbox:
        sid = _raise(_host_call(self.host, self.host_id, "acquire", self.fresh))
        return RemoteSandbox(self.host, sid, self.host_id)

    def create_fresh(self) -> RemoteSandbox:
        """A new container on this host, whatever the supply (the counterfactual check's);
        destroying it releases it."""
        sid = _raise(_host_call(self.host, self.host_id, "acquire", True))
        return RemoteSandbox(self.host, sid, self.host_id)

    def release(self, sandbox: RemoteSandbox, *, reusable: bool = False) -> None:
        try:
            _host_call(self.host, self.host_id, "release", sandbox.id, reusable)
        except InfraFailure:
            pass  # the host is gone, and its containers with it

    def close(self) -> None:
        pass


# --- rollout workers --------------------------------------------------------------------

class _NoLocalSandboxes:
    """A worker's runtime makes no sandboxes of its own: they come from the hosts."""

    def __init__(self, image: str, limits: SandboxLimits) -> None:
        self.image, self.limits = image, limits

    def create(self) -> Any:
        raise RuntimeError("on the Ray backend, sandboxes come from sandbox hosts (use ctx.sandboxes)")


class RolloutWorker:
    """Runs episode functions (the Ray actor's class; see the module's docstring)."""

    def __init__(self, env: LoadedEnvironment, build: BuildResult, urls: list[str], affinity: bool,
                 setup: Callable[[], Any] | None = None) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        limits = SandboxLimits.from_spec(env.spec.limits)
        self.runtime = EnvRuntime(env, build_result=build, backend=_NoLocalSandboxes(build.image_id, limits))
        self.router = Router([PolicyClient(u) for u in urls], affinity=affinity, record=True)
        self.extra = setup() if setup is not None else None
        self.cancels: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def ready(self) -> str:
        return str(self.node_id)

    def run(self, fn: Callable[..., Trajectory], kwargs: dict[str, Any], host: Any, host_id: str, session: str,
            attempt: int) -> tuple[Any, ...]:
        cancel = threading.Event()
        with self.lock:
            self.cancels[session] = cancel
        ctx = EpisodeContext(self.runtime, self.router, HostSandboxes(host, host_id, fresh=attempt > 0), cancel,
                             session, self.extra, attempt)
        try:
            traj = fn(ctx, **kwargs)
            reply: tuple[Any, ...] = ("ok", traj)
        except EpisodeFailure as e:
            reply = _err(e)
        finally:
            with self.lock:
                self.cancels.pop(session, None)
            events = self.router.take_events(session)
        return reply + (events, self.node_id)

    def cancel(self, session: str) -> None:
        with self.lock:
            ev = self.cancels.get(session)
        if ev is not None:
            ev.set()


# --- the driver ---------------------------------------------------------------------------

@dataclass
class _Member:
    handle: Any
    info: dict[str, Any]
    load: int = 0
    alive: bool = True


@dataclass
class RayRollouts:
    """The driver's view of the cluster (see the module's docstring)."""

    runtime: EnvRuntime
    urls: list[str]
    address: str | None = None
    workers: int | None = None
    affinity: bool = True
    max_retries: int = 2
    worker_setup: Callable[[], Any] | None = None
    episodes_per_worker: int = 256
    router: Router | None = None  # where the workers' requests are counted (default: a router of its own)
    hosts: list[_Member] = field(default_factory=list)
    pool: list[_Member] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        self.owns_ray = False
        self.owns_router = self.router is None
        self.counter: Router = self.router or Router([PolicyClient(u) for u in self.urls], affinity=self.affinity)
        self.router = self.counter
        self.lock = threading.Lock()

    def start(self) -> RayRollouts:
        ray = require_ray()
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            try:
                ray.init(address=self.address or "auto", log_to_driver=False, configure_logging=False)
            except ConnectionError as e:
                raise UserError(f"no Ray cluster answers at {self.address or 'auto'}: {e}",
                                "start one (ray start --head …) and pass its address, or omit the address to "
                                "start a local one") from None
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(HOST_RESOURCE, 0) > 0]
        if not nodes:
            raise UserError(f"the Ray cluster has no node with the `{HOST_RESOURCE}` resource, so no sandbox host",
                            f"start each CPU (sandbox) node with: ray start --address=HEAD:PORT --resources "
                            f"'{{\"{HOST_RESOURCE}\": 1}}'")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host_cls = ray.remote(SandboxHost)
        spec = SandboxSpec.of(self.runtime)
        # One host per sandbox node for this environment, pinned there; each takes a small share
        # of the node's resource so that several environments' hosts can share a node.
        handles = [host_cls.options(resources={HOST_RESOURCE: HOST_SHARE}, num_cpus=0, max_concurrency=4096, max_restarts=0,
                                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                   .remote(spec, self.run_id) for node in nodes]
        try:
            infos = ray.get([h.info.remote() for h in handles], timeout=300)
        except ray.exceptions.RayActorError as e:  # a host's constructor refused (e.g. its engine lacks the image)
            for h in handles:
                ray.kill(h)
            why = next((line.split("UserError:", 1)[1].strip() for line in str(e).splitlines() if "UserError:" in line), str(e)[-500:])
            images = ("every task image of this container environment (its builds are not reproducible: `docker save` "
                      "them here and `docker load` them there)" if self.runtime.container else
                      "the environment's image (envkit build it there, or load it by digest)")
            raise UserError(f"a sandbox host could not start: {why}",
                            f"every sandbox node needs Docker running and {images}") from None
        self.hosts = [_Member(h, i) for h, i in zip(handles, infos, strict=True)]
        w = self.workers or len({i["node"] for i in infos})
        worker_cls = ray.remote(RolloutWorker)
        whandles = [worker_cls.options(num_cpus=0, max_concurrency=self.episodes_per_worker + 16, max_restarts=0,
                                       scheduling_strategy="SPREAD")
                    .remote(self.runtime.env, self.runtime.build, self.urls, self.affinity, self.worker_setup)
                    for _ in range(w)]
        nodes = ray.get([h.ready.remote() for h in whandles], timeout=600)
        self.pool = [_Member(h, {"node": node}) for h, node in zip(whandles, nodes, strict=True)]
        return self

    # -- supply ---------------------------------------------------------------------------
    def live_hosts(self) -> list[_Member]:
        return [h for h in self.hosts if h.alive]

    def configure(self, kind: str, size: int) -> None:
        """Every live host starts a new supply; a pool's ``size`` is split across hosts."""
        import ray

        live = self.live_hosts()
        ray.get([h.handle.configure.remote(kind, split(size, len(live))) for h in live])

    def occupancy(self, t0: float, t1: float) -> tuple[float, float]:
        """(held, alive) sandbox-seconds over a window of the driver's monotonic clock."""
        import ray

        off = _wall_offset()
        held = alive = 0.0
        for h in self.live_hosts():
            try:
                a, b = ray.get(h.handle.occupancy.remote(t0 + off, t1 + off), timeout=60)
            except ray.exceptions.RayActorError:
                h.alive = False
                continue
            held, alive = held + a, alive + b
        return held, alive

    def sandbox_stats(self) -> dict[str, Any]:
        import ray

        out: dict[str, Any] = {"hosts": len(self.live_hosts())}
        for h in self.live_hosts():
            try:
                s = ray.get(h.handle.stats.remote(), timeout=60)
            except ray.exceptions.RayActorError:
                h.alive = False
                continue
            for k, v in s.items():
                out[k] = out.get(k, 0) + v if isinstance(v, int) else v
        return out

    # -- episodes -------------------------------------------------------------------------
    def _pick(self, members: list[_Member], avoid: set[int]) -> _Member | None:
        with self.lock:
            live = [m for m in members if m.alive]
            preferred = [m for m in live if id(m) not in avoid] or live
            if not preferred:
                return None
            m = min(preferred, key=lambda m: m.load)
            m.load += 1
            return m

    def _done(self, m: _Member) -> None:
        with self.lock:
            m.load -= 1

    def run(self, fn: Callable[..., Trajectory], kwargs: dict[str, Any], *, session: str, cancel: threading.Event,
            describe: Callable[[], Trajectory]) -> Trajectory:
        """One episode, retried on another host after an infra or verifier failure.
        ``describe()`` makes the (empty) record of an episode that never ran."""
        import ray

        used: set[int] = set()

        def attempt(n: int, failed: list[str]) -> Trajectory:
            host = self._pick(self.hosts, used)
            worker = self._pick(self.pool, set())
            if host is None or worker is None:
                if host is not None:
                    self._done(host)
                if worker is not None:
                    self._done(worker)
                what = "sandbox host" if host is None else "rollout worker"
                raise StopRetrying(f"infra_failure:no_{what.replace(' ', '_')}", {"message": f"no live {what} is left"})
            used.add(id(host))
            try:
                ref = worker.handle.run.remote(fn, kwargs, host.handle, host.info["host"], session, n)
                cancelled = False
                while True:
                    ready, _ = ray.wait([ref], timeout=0.5)
                    if ready:
                        break
                    if cancel.is_set() and not cancelled:
                        worker.handle.cancel.remote(session)
                        cancelled = True
                reply = ray.get(ref)
            except ray.exceptions.RayActorError:
                worker.alive = False
                return failure_record(describe, "infra_failure:rollout_worker_lost",
                                      {"message": "the rollout worker running it is gone", "worker_node": worker.info["node"]})
            finally:
                self._done(host)
                self._done(worker)
            events, worker_node = reply[-2:]
            self.counter.absorb(events, _wall_offset())
            if reply[0] == "err":
                _, category, kind, _message, evidence = reply[:5]
                traj = failure_record(describe, format_outcome(FailureCategory(category), kind), evidence)
            else:
                traj = reply[1]
            if traj.outcome.kind == "sandbox_host_lost":
                self._host_lost(host)
            traj.placement = {"sandbox_host": host.info["host"], "sandbox_node": host.info["node"], "worker_node": worker_node}
            return traj

        return run_attempts(attempt, max_retries=self.max_retries, describe=describe)

    def _host_lost(self, host: _Member) -> None:
        """Mark a host dead (if it is) and have the live ones remove its containers."""
        import ray

        try:
            ray.get(host.handle.info.remote(), timeout=10)
            return  # it answers: the failure was one sandbox's, not the host's
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        with self.lock:
            if not host.alive:
                return
            host.alive = False
        live = [h.info["host"] for h in self.live_hosts()]
        for h in self.live_hosts():
            try:
                ray.get(h.handle.reap.remote(live), timeout=120)
            except ray.exceptions.RayActorError:
                h.alive = False

    def close(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        live = [h.info["host"] for h in self.live_hosts()]
        for h in self.live_hosts():
            try:
                ray.get(h.handle.close.remote(), timeout=120)
                ray.get(h.handle.reap.remote([x for x in live if x != h.info["host"]] + [h.info["host"]]), timeout=120)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        for m in self.hosts + self.pool:
            try:
                ray.kill(m.handle)
            except Exception:  # noqa: BLE001
                pass
        if self.owns_router:
            self.counter.close()
        if self.owns_ray:
            ray.shutdown()


# --- a local cluster (tests, the benchmark's default) ---------------------------------------

class LocalRayCluster:
    """A Ray head and ``nodes - 1`` more node processes on this machine, each with one
    ``envkit_sandbox_host`` (they share this machine's Docker engine). Stopped on ``stop()``:
    every node process was started with ``--block`` in its own process group."""

    def __init__(self, nodes: int = 2, *, cpus_per_node: int = 1, object_store_mb: int = 100) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.nodes = nodes
        self.cpus = cpus_per_node
        self.object_store = object_store_mb * 1024 * 1024
        self.procs: list[subprocess.Popen[bytes]] = []
        self.address = ""
        self.temp = Path(tempfile.mkdtemp(prefix="envkit-ray-"))

    def _ray(self) -> str:
        exe = str(Path(sys.executable).parent / "ray")
        if not Path(exe).exists():
            exe = shutil.which("ray") or exe
        if not Path(exe).exists():
            require_ray()
            raise UserError("the `ray` command is not on PATH", "install envkit[ray] into the Python you run envkit with")
        return exe

    def _node(self, *args: str) -> None:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        cmd = [self._ray(), "start", "--block", f"--num-cpus={self.cpus}", f"--object-store-memory={self.object_store}",
               "--resources", f'{{"{HOST_RESOURCE}": 1}}', "--disable-usage-stats", *args]
        with open(self.temp / f"node-{len(self.procs)}.log", "wb") as log:  # the node has its own copy of the descriptor
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def start(self, timeout: float = 240) -> LocalRayCluster:
        """Start the nodes and connect this process to the cluster (``ray.init``)."""
        ray = require_ray()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        self._node("--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                   f"--temp-dir={self.temp}")
        deadline = time.monotonic() + timeout
        while not ray.is_initialized():
            self._check_procs()
            try:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False)
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the local Ray head did not start; see {self.temp}/node-0.log") from None
                time.sleep(1.0)
        for _ in range(1, self.nodes):
            self._node(f"--address={self.address}", "--node-ip-address=127.0.0.1")
        while sum(1 for n in ray.nodes() if n.get("Alive")) < self.nodes \
                or ray.cluster_resources().get(HOST_RESOURCE, 0) < self.nodes:
            self._check_procs()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the local Ray cluster did not reach {self.nodes} nodes; see {self.temp}/node-*.log")
            time.sleep(0.5)
        return self

    def _check_procs(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a Ray node exited ({p.returncode}); see {self.temp}/node-*.log")

    def stop(self) -> None:
        import signal

        import ray

        if ray.is_initialized():
            ray.shutdown()
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever of the node is left (its raylet, GCS, workers share its process group)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        self.procs.clear()
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
