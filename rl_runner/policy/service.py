"""The policy a run generates with: its own vLLM replicas of a model, or servers already
running, one client per replica, routers over them, and one teardown.

    with PolicyService(model, replicas=2, cores=partition, log_dir=run_dir) as policy:
        policy.start(say)                       # every replica at once; waits until each answers
        router = policy.router(affinity=True)   # session-affine over the replicas
        ...                                     # stop(): routers, clients, then the servers

Training (:mod:`rl_runner.recipes.grpo`), ``envkit eval``, ``envkit rollout`` and ``envkit bench
rollout`` all get their policy here. With ``urls`` (running servers, ``--policy-url``) nothing
is started or stopped but the clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from rl_runner.partition import CpuPartition
from rl_runner.policy.client import PolicyClient
from rl_runner.policy.router import Router
from rl_runner.policy.server import VLLMServer

__all__ = ["PolicyService"]


class PolicyService:
    """vLLM replicas of ``model`` (``replicas`` of them, each on its cores of ``cores``, logs
    in ``log_dir``: ``vllm.log``, ``vllm-1.log``…) or the running servers at ``urls``."""

    def __init__(self, model: str | Path | None, *, urls: Sequence[str] | None = None, replicas: int = 1,
                 cores: CpuPartition | None = None, log_dir: Path | None = None,
                 extra_args: list[str] | None = None) -> None:
        if not urls and model is None:
            raise ValueError("a PolicyService needs a model to serve or the URLs of running servers")
        self.model = model
        self.servers: list[VLLMServer] = [] if urls else [
            VLLMServer(model,  # type: ignore[arg-type]  # not None without urls (checked above)
                       log_path=(log_dir / ("vllm.log" if k == 0 else f"vllm-{k}.log")) if log_dir else None,
                       extra_args=extra_args, cpu_bind=cores.bind(k) if cores else None,
                       affinity=cores.affinity(k) if cores else None)
            for k in range(replicas)]
        self.urls: list[str] = list(urls) if urls else [s.url for s in self.servers]
        self.clients: list[PolicyClient] = [PolicyClient(u) for u in self.urls]

    @property
    def own(self) -> bool:
        """Whether the replicas are this service's (started and stopped by it)."""
        return bool(self.servers)

    def start(self, say: Callable[[str], None] | None = None) -> PolicyService:
        """Start every replica at once and wait until each answers (nothing for running servers)."""
        if self.servers:
            if say is not None:
                say(f"starting {len(self.servers)} vLLM replica(s) of {self.model} …")
            with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
                list(pool.map(lambda s: s.start(), self.servers))
        return self

    def ready(self) -> Callable[[], bool] | None:
        """What a retry after an inference outage waits for: every own replica answers or has
        exited (None for running servers: nothing here can restart them)."""
        servers = self.servers
        return (lambda: all(s.settled() for s in servers)) if servers else None

    def router(self, *, affinity: bool = True) -> Router:
        """A router over the replicas' clients (closed with the service). ``affinity``: one
        session's turns go to one replica (its prefix cache)."""
        return Router(self.clients, affinity=affinity)

    def reset_prefix_caches(self) -> None:
        """Empty every replica's prefix cache (a benchmark's policies each start cold)."""
        for url in self.urls:
            httpx.post(f"{url}/reset_prefix_cache", params={"reset_running_requests": "true"}, timeout=30)

    def stop(self) -> None:
        """Close the clients, then stop the own replicas (each's whole process group)."""
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.stop()

    def __enter__(self) -> PolicyService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
