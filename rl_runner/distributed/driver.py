"""The Ray backend's driver side of the rollout seam (:mod:`rl_runner.distributed.rollouts`):
sandbox hosts on CPU nodes (:mod:`rl_runner.distributed.host`), rollout workers scheduled by
Ray (:mod:`rl_runner.distributed.worker`), vLLM replicas as separate servers.

``run(fn, kwargs, session=, cancel=, describe=)`` runs one episode attempt after another until one is not
an infra or verifier failure: it picks the least busy live host and worker, waits, and on a
failure retries on a *different* host (when one is left). A sandbox host that dies
mid-episode (node lost, actor killed) turns that episode's next sandbox call into
``infra_failure:sandbox_host_lost``; the host is marked dead, its episodes are retried
elsewhere, and its containers are removed by a live host that shares its engine (a lost node
takes its containers with it; a host killed on a node that stays up leaves them, labelled
with the run, until removed by hand). Each episode's result is returned exactly once, with
``retries`` and the failed ``attempts``.

Clocks: figures that combine several processes (inference occupancy, sandbox occupancy) travel
as wall-clock times and are converted to the driver's monotonic clock on arrival; across
machines they are as good as the nodes' clock synchronisation.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envkit.errors import InfraFailure, UserError
from envkit.runtime import EnvRuntime
from rl_runner.distributed.cluster import HOST_RESOURCE, ray_init, require_ray
from rl_runner.distributed.context import before_attempt, queued
from rl_runner.distributed.host import SandboxHost
from rl_runner.distributed.local import split
from rl_runner.distributed.replies import WorkerReply, wall_offset
from rl_runner.distributed.worker import RolloutWorker
from rl_runner.policy.client import PolicyClient
from rl_runner.policy.router import Router
from rl_runner.rollout.retry import StopRetrying, failure_record, run_attempts
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["RayRollouts"]

HOST_SHARE = 0.01  # of a node's HOST_RESOURCE taken by one environment's host
HOST_START_TRIES = 3  # a host whose process dies before its constructor runs is placed again


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
    policy_ready: Callable[[], bool] | None = None  # polled before retrying an inference failure
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
                ray_init(ray, address=self.address or "auto", log_to_driver=False, configure_logging=False)
            except ConnectionError as e:
                raise UserError(f"no Ray cluster answers at {self.address or 'auto'}: {e}",
                                "start one (ray start --head …) and pass its address, or omit the address to "
                                "start a local one") from None
        nodes = [n["NodeID"] for n in ray.nodes()
                 if n.get("Alive") and n.get("Resources", {}).get(HOST_RESOURCE, 0) > 0]
        if not nodes:
            raise UserError(f"the Ray cluster has no node with the `{HOST_RESOURCE}` resource, so no sandbox host",
                            f"start each CPU (sandbox) node with: ray start --address=HEAD:PORT --resources "
                            f"'{{\"{HOST_RESOURCE}\": 1}}'")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host_cls = ray.remote(SandboxHost)
        spec = self.runtime.sandbox_spec()

        def place(node: str) -> Any:
            # One host per sandbox node for this environment, pinned there; each takes a small share
            # of the node's resource so that several environments' hosts can share a node.
            return (host_cls.options(resources={HOST_RESOURCE: HOST_SHARE}, num_cpus=0, max_concurrency=4096,
                                     max_restarts=0,
                                     scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                    .remote(spec, self.run_id))

        def abandon() -> None:
            for h in handles:
                ray.kill(h)

        handles = [place(node) for node in nodes]
        infos: list[Any] = [None] * len(handles)
        for attempt in range(HOST_START_TRIES):
            todo = [k for k, i in enumerate(infos) if i is None]
            for k in todo:
                try:
                    infos[k] = ray.get(handles[k].info.remote(), timeout=300)
                except ray.exceptions.RayActorError as e:
                    why = next((line.split("UserError:", 1)[1].strip() for line in str(e).splitlines()
                                if "UserError:" in line), None)
                    if why is not None:  # its constructor refused (e.g. its engine lacks the image): a user's fix
                        abandon()
                        raise UserError(f"a sandbox host could not start: {why}",
                                        f"every sandbox node needs Docker running and the environment's images: "
                                        f"{spec.missing_image_hint}") from None
                    # its process died before the constructor ran (worker start-up on a loaded node,
                    # a killed process): not the environment's fault, so a new one is placed there
                    if attempt + 1 == HOST_START_TRIES:
                        abandon()
                        raise InfraFailure("sandbox_host_lost",
                                           f"the sandbox host on node {nodes[k][:12]} died {HOST_START_TRIES} "
                                           f"times before it started: {str(e)[-400:]}") from None
                    handles[k] = place(nodes[k])
        self.hosts = [_Member(h, i) for h, i in zip(handles, infos, strict=True)]
        w = self.workers or len({i["node"] for i in infos})
        worker_cls = ray.remote(RolloutWorker)
        whandles = [worker_cls.options(num_cpus=0, max_concurrency=self.episodes_per_worker + 16, max_restarts=0,
                                       scheduling_strategy="SPREAD")
                    .remote(self.runtime.env, self.runtime.build, self.urls, self.affinity, self.worker_setup,
                            self.runtime.limits.runtime)
                    for _ in range(w)]
        nodes = ray.get([h.ready.remote() for h in whandles], timeout=600)
        self.pool = [_Member(h, {"node": node}) for h, node in zip(whandles, nodes, strict=True)]
        return self

    # -- supply ---------------------------------------------------------------------------
    def live_hosts(self) -> list[_Member]:
        return [h for h in self.hosts if h.alive]

    def configure(self, kind: str, size: int, *, fill_timeout: float = 0.0) -> None:
        """Every live host starts a new supply; a pool's ``size`` is split across hosts (filled
        on all of them at once when ``fill_timeout`` > 0)."""
        import ray

        live = self.live_hosts()
        ray.get([h.handle.configure.remote(kind, split(size, len(live)), fill_timeout) for h in live])

    def occupancy(self, t0: float, t1: float) -> tuple[float, float]:
        """(held, alive) sandbox-seconds over a window of the driver's monotonic clock."""
        import ray

        off = wall_offset()
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
            describe: Callable[[], Trajectory], on_attempt: Callable[[int], None] | None = None) -> Trajectory:
        """One episode, retried on another host after an infra or verifier failure.
        ``describe()`` makes the (empty) record of an episode that never ran."""
        import ray

        if on_attempt is not None:
            raise ValueError("on_attempt hooks run on the episode's thread; "
                             "on Ray the episode runs in a rollout worker")
        used: set[int] = set()
        since = time.monotonic()

        def attempt(n: int, failed: list[str]) -> Trajectory:
            before_attempt(n, failed, policy_ready=self.policy_ready, on_attempt=None)
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
                reply: WorkerReply = ray.get(ref)
            except ray.exceptions.RayActorError:
                worker.alive = False
                return failure_record(describe, "infra_failure:rollout_worker_lost",
                                      {"message": "the rollout worker running it is gone",
                                       "worker_node": worker.info["node"]})
            finally:
                self._done(host)
                self._done(worker)
            self.counter.absorb(reply.events, wall_offset())
            if reply.failure is not None:
                traj = failure_record(describe, reply.failure.label, reply.failure.evidence)
            else:
                assert reply.trajectory is not None
                traj = reply.trajectory
            if traj.outcome.kind == "sandbox_host_lost":
                self._host_lost(host)
            traj.placement = {"sandbox_host": host.info["host"], "sandbox_node": host.info["node"],
                              "worker_node": reply.node}
            return traj

        return queued(run_attempts(attempt, max_retries=self.max_retries, describe=describe), since)

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
