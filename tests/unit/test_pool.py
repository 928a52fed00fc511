"""The warm pool against fake sandboxes (its declared seam: the factory callable)."""

import threading
import time

import pytest

from envkit.errors import InfraFailure
from envkit.sandbox.pool import RateLimiter, WarmPool


class FakeSandbox:
    def __init__(self, n: int) -> None:
        self.n = n
        self.alive_flag = True
        self.destroyed = False

    def alive(self) -> bool:
        return self.alive_flag

    def destroy(self) -> None:
        self.destroyed = True


class Factory:
    def __init__(self, fail_first: int = 0) -> None:
        self.made: list[FakeSandbox] = []
        self.times: list[float] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def __call__(self) -> FakeSandbox:
        with self.lock:
            self.times.append(time.monotonic())
            if self.fail_first > 0:
                self.fail_first -= 1
                raise InfraFailure("sandbox_start", "injected")
            sb = FakeSandbox(len(self.made))
            self.made.append(sb)
            return sb


def test_rate_limiter_with_fake_clock():
    now = [0.0]
    limiter = RateLimiter(2.0, burst=1, clock=lambda: now[0])
    assert limiter.wait_time() == 0
    assert limiter.wait_time() == pytest.approx(0.5)
    now[0] = 0.5
    assert limiter.wait_time() == 0


def test_fills_to_target_and_hands_out_ready_sandboxes():
    factory = Factory()
    with WarmPool(factory, 3, max_create_per_s=100) as pool:
        assert pool.wait_ready(timeout=5)
        assert pool.ready == 3
        got = pool.acquire(timeout=5)
        assert isinstance(got, FakeSandbox)
        assert pool.stats.hits == 1
        pool.release(got)
        assert pool.wait_ready(timeout=5)
        assert len(factory.made) == 4
    assert all(sb.destroyed for sb in factory.made)


def test_creation_rate_is_limited():
    factory = Factory()
    # No burst credit: four creations at 5/s need at least three 0.2 s gaps.
    with WarmPool(factory, 4, max_create_per_s=5, burst=1, max_parallel=4) as pool:
        assert pool.wait_ready(timeout=10)
    span = factory.times[-1] - factory.times[0]
    assert len(factory.times) == 4
    assert span >= 0.55, f"4 creations at 5/s took only {span:.3f} s"


def test_unhealthy_sandbox_is_replaced_not_handed_out():
    factory = Factory()
    with WarmPool(factory, 2, max_create_per_s=100) as pool:
        assert pool.wait_ready(timeout=5)
        factory.made[0].alive_flag = False
        got = pool.acquire(timeout=5)
        assert got.alive_flag
        assert pool.stats.unhealthy == 1


def test_a_reusing_pool_never_holds_more_than_its_size_during_health_checks():
    """A sandbox taken from the ready queue still counts while its health is checked: the
    filler must not start a replacement for it (CI, 2026-12-07: a slow check under load let a
    pool of 6 make 8 containers for 8 episodes and reuse none)."""
    factory = Factory()

    def slow_health(sb: FakeSandbox) -> bool:
        time.sleep(0.05)
        return sb.alive()

    with WarmPool(factory, 2, reuse=True, max_create_per_s=1000, health=slow_health) as pool:
        assert pool.wait_ready(timeout=5)
        for _ in range(6):
            a, b = pool.acquire(timeout=5), pool.acquire(timeout=5)
            pool.release(a, reusable=True)
            pool.release(b, reusable=True)
        time.sleep(0.1)  # what the filler would have started meanwhile
        assert len(factory.made) == 2 and pool.stats.reused == 10, (len(factory.made), pool.stats)


def test_failed_creations_are_retried_and_recorded():
    factory = Factory(fail_first=2)
    with WarmPool(factory, 1, max_create_per_s=100) as pool:
        assert pool.wait_ready(timeout=10)
        assert pool.stats.create_failures == 2
        assert "injected" in pool.stats.last_error


def test_acquire_times_out_with_infra_failure():
    def never() -> FakeSandbox:
        raise InfraFailure("sandbox_start", "engine down")

    with WarmPool(never, 1, max_create_per_s=100) as pool:
        with pytest.raises(InfraFailure) as info:
            pool.acquire(timeout=0.3)
        assert info.value.kind == "pool_timeout"


def test_every_sandbox_class_implements_the_whole_contract():
    """Docker, container-environment and Ray-host sandboxes derive from the abstract Sandbox
    with no operation left abstract (one left out would fail only when a sandbox is made)."""
    from envkit.sandbox import Sandbox
    from envkit.sandbox.container import ContainerSandbox
    from envkit.sandbox.docker_backend import DockerSandbox
    from rl_runner.distributed.host import RemoteSandbox

    assert Sandbox.__abstractmethods__ >= {"exec", "reset", "put_tree", "prepare_verifier", "http", "destroy"}
    for cls in (DockerSandbox, ContainerSandbox, RemoteSandbox):
        assert issubclass(cls, Sandbox) and not cls.__abstractmethods__, cls
