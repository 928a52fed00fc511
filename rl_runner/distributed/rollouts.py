"""The one seam where episodes run: training, evaluation, ``envkit rollout`` and ``envkit
bench rollout`` all hand episode functions to a :class:`Rollouts`, chosen once at setup by
:func:`open_rollouts`: this machine (:class:`~rl_runner.distributed.local.LocalRollouts`) or
a Ray cluster (:class:`~rl_runner.distributed.driver.RayRollouts`).

An *episode function* is a module-level callable ``fn(ctx: EpisodeContext, **kwargs) ->
Trajectory`` (pickled by reference on Ray: every node must have envkit installed). It takes
its sandboxes from ``ctx.sandboxes`` and its policy from ``ctx.policy``, so the same function
runs on either backend. There is one per purpose: the model-driven agent
(:func:`rl_runner.rollout.loop.agent_episode`) and the benchmark's scripted agent
(:func:`rl_runner.batch.workload.scripted_episode`).

``run(fn, kwargs, session=, cancel=, describe=)`` runs attempts under the retry rule of
:mod:`rl_runner.rollout.retry` (each retry on a fresh sandbox) and returns the one trajectory
that counts; ``describe()`` makes the record of an episode that never ran. Before each attempt
the backend waits for the policy after an ``inference_unavailable`` failure (``policy_ready``)
and, on the local backend, calls the caller's ``on_attempt(n)`` hook on the episode's own
thread (the chaos injector's; the Ray backend refuses one: its episodes run in other
processes, out of the hook's reach).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from envkit.runtime import EnvRuntime
from rl_runner.distributed.context import EpisodeContext
from rl_runner.distributed.local import LocalRollouts
from rl_runner.policy.router import Router
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["EpisodeContext", "RayPlacement", "Rollouts", "open_rollouts"]


class Rollouts(Protocol):
    """Where one environment's episodes run (see the module's docstring)."""

    runtime: EnvRuntime

    def configure(self, kind: str, size: int, *, fill_timeout: float = 0.0) -> None:
        """A new sandbox supply: ``pool`` (a reusing warm pool of ``size``) or ``fresh``.
        ``fill_timeout`` > 0: return once the pool is full (or that many seconds have passed)."""

    def run(self, fn: Callable[..., Trajectory], kwargs: dict[str, Any], *, session: str, cancel: threading.Event,
            describe: Callable[[], Trajectory], on_attempt: Callable[[int], None] | None = None) -> Trajectory: ...

    def occupancy(self, t0: float, t1: float) -> tuple[float, float]:
        """(held, alive) sandbox-seconds over a window of this process's monotonic clock."""

    def sandbox_stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RayPlacement:
    """Where the Ray backend runs: the cluster's address, rollout workers (default: one per
    sandbox node) and episodes each worker runs at once."""

    address: str
    workers: int | None = None
    episodes_per_worker: int = 256


def open_rollouts(runtime: EnvRuntime, router: Router, *, ray: RayPlacement | None = None,
                  setup: Callable[[], Any] | None = None, max_retries: int = 2,
                  policy_ready: Callable[[], bool] | None = None, supply: tuple[str, int] = ("fresh", 0)) -> Rollouts:
    """The environment's :class:`Rollouts`: this machine's, or (``ray``) the cluster's.
    ``setup()`` makes what episode functions find in ``ctx.extra`` (on Ray, in every worker);
    ``supply`` is the first sandbox supply (``("pool", size)`` or ``("fresh", 0)``)."""
    rollouts: Rollouts
    if ray is None:
        rollouts = LocalRollouts(runtime, router, max_retries=max_retries, extra=setup() if setup else None,
                                 policy_ready=policy_ready)
    else:
        from rl_runner.distributed.driver import RayRollouts

        rollouts = RayRollouts(runtime, [c.url for c in router.clients], address=ray.address, workers=ray.workers,
                               affinity=router.affinity, max_retries=max_retries, worker_setup=setup,
                               episodes_per_worker=ray.episodes_per_worker, router=router,
                               policy_ready=policy_ready).start()
    try:
        rollouts.configure(*supply)
    except BaseException:
        rollouts.close()
        raise
    return rollouts
