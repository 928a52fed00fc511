"""The backends' shared rules with fake episode functions (the declared seam: an episode
function), and the bookkeeping that carries figures across processes."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from envkit.errors import InfraFailure, ModelFailure
from envkit.occupancy import Occupancy
from rl_runner.distributed.local import LocalRollouts
from rl_runner.policy.router import Router
from rl_runner.rollout.trajectory import Trajectory


class _Backend:
    """Counts containers; the fresh sandboxes of retries come from here."""

    def __init__(self) -> None:
        self.created = 0

    def create(self) -> Any:
        self.created += 1
        return SimpleNamespace(id=f"sb{self.created}", destroy=lambda: None)


def _runtime() -> Any:
    return SimpleNamespace(backend=_Backend(), env=SimpleNamespace(ref="t/e@1"),
                           build=SimpleNamespace(image_id="sha256:x"))


def _describe() -> Trajectory:
    return Trajectory(env_ref="t/e@1", image_digest="sha256:x", task_id="t", seed=0, group_id="g")


def _rollouts() -> LocalRollouts:
    return LocalRollouts(_runtime(), Router([]), max_retries=2)


def test_infra_failures_are_retried_on_fresh_sandboxes_and_reported():
    seen: list[tuple[int, str]] = []

    def flaky(ctx: Any) -> Trajectory:
        sb = ctx.sandboxes.acquire()
        seen.append((ctx.attempt, type(ctx.sandboxes).__name__))
        ctx.sandboxes.release(sb)
        if ctx.attempt == 0:
            raise InfraFailure("container_lost", "gone")
        if ctx.attempt == 1:
            t = _describe()
            t.outcome = "infra_failure:reset_failed"
            return t
        t = _describe()
        t.reward = 1.0
        return t

    r = _rollouts()
    t = r.run(flaky, {}, session="s", cancel=threading.Event(), describe=_describe)
    assert t.outcome == "ok" and t.reward == 1.0 and not t.excluded
    assert t.retries == 2 and t.attempts == ["infra_failure:container_lost", "infra_failure:reset_failed"]
    assert [a for a, _ in seen] == [0, 1, 2] and all(kind == "FreshSandboxes" for _, kind in seen)


def test_retries_run_out_into_an_excluded_record_and_model_failures_are_not_retried():
    calls = []

    def broken(ctx: Any) -> Trajectory:
        calls.append(ctx.attempt)
        raise InfraFailure("docker_api", "engine said no")

    t = _rollouts().run(broken, {}, session="s", cancel=threading.Event(), describe=_describe)
    assert calls == [0, 1, 2] and t.excluded and t.outcome == "infra_failure:docker_api"
    assert t.exclude_reason == "infra_failure:docker_api after 3 attempts" and t.retries == 2

    calls.clear()

    def model(ctx: Any) -> Trajectory:
        calls.append(ctx.attempt)
        raise ModelFailure("episode_timeout", "too slow")

    t = _rollouts().run(model, {}, session="s", cancel=threading.Event(), describe=_describe)
    assert calls == [0] and t.outcome == "model_failure:episode_timeout" and t.excluded and t.retries == 0


def test_occupancy_spans_added_after_the_fact_shift_later_counts():
    clock = iter([0.0, 10.0]).__next__
    occ = Occupancy(clock=clock)  # created at t=0
    occ.add(1)  # t=10: one request of its own, still in flight
    occ.add_span(2.0, 6.0)
    occ.add_span(4.0, 12.0)
    assert occ.integral(0, 20) == pytest.approx(4 + 8 + 10)
    assert occ.time_below(0, 12, 1) == pytest.approx(2.0)  # idle only over [0, 2]
    assert occ.value == 1  # the spans closed: only the live request counts now


def test_a_router_absorbs_requests_recorded_in_another_process():
    worker = Router([], record=True)
    worker.events["s1"] = [(0, 100.0, 101.5, 40, 32)]  # what generate() records: wall-clock times
    events = worker.take_events("s1")
    assert events and worker.take_events("s1") == []
    driver = Router([SimpleNamespace(url="http://a", close=lambda: None)])  # type: ignore[list-item]
    driver.absorb(events, offset=100.0)  # wall 100 = the driver's monotonic 0
    assert driver.in_flight[0].integral(0.0, 2.0) == pytest.approx(1.5)
    stats = driver.cache_stats()
    assert stats["prompt_tokens"] == 40 and stats["cached_tokens"] == 32 and stats["requests"] == [1]
    with pytest.raises(RuntimeError, match="no policy replicas"):
        Router([]).generate([1], None, session="x")  # type: ignore[arg-type]
