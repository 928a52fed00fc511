"""A local Ray cluster (tests, the benchmark's default) and what every Ray entry needs: the
``ray`` package, and the custom resource that marks a sandbox node."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from envkit.errors import UserError
from envkit.extras import require

__all__ = ["HOST_RESOURCE", "LocalRayCluster", "require_ray"]

HOST_RESOURCE = "envkit_sandbox_host"


def require_ray() -> Any:
    require("ray", "the Ray backend")
    import ray

    return ray


def ray_init(ray: Any, **kwargs: Any) -> Any:
    """``ray.init`` without its SIGTERM handler: Ray's driver handler exits with status 15
    and no message where envkit's (envkit/cli/app.py) unwinds as for Ctrl-C and exits 143."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        return ray.init(**kwargs)
    finally:
        if main and before is not None:
            signal.signal(signal.SIGTERM, before)


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
            raise UserError("the `ray` command is not on PATH",
                            "install envkit[ray] into the Python you run envkit with")
        return exe

    def _node(self, *args: str) -> None:
        # a worker process that takes over a minute to start (Ray's default) on cores vLLM keeps
        # busy would otherwise cancel the actor it was starting for
        env = {"RAY_worker_register_timeout_seconds": "300", **os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        cmd = [self._ray(), "start", "--block", f"--num-cpus={self.cpus}", f"--object-store-memory={self.object_store}",
               "--resources", f'{{"{HOST_RESOURCE}": 1}}', "--disable-usage-stats", *args]
        # the node has its own copy of the descriptor
        with open(self.temp / f"node-{len(self.procs)}.log", "wb") as log:
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True))

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
                ray_init(ray, address=self.address, log_to_driver=False, configure_logging=False)
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
                raise RuntimeError(f"the local Ray cluster did not reach {self.nodes} nodes; "
                                   f"see {self.temp}/node-*.log")
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
        deadline = time.monotonic() + 5  # `ray start --block` took ~30 s to act on TERM here; nothing of it is kept
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
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
