"""The one retry loop (rl_runner.rollout.retry) that the rollout runner, the local backend and
the Ray backend share: what an attempt is told, and an attempt that stops the retries."""

from __future__ import annotations

from envkit.errors import InfraFailure, VerifierFailure
from rl_runner.rollout.retry import StopRetrying, run_attempts
from rl_runner.rollout.trajectory import Trajectory


def _describe() -> Trajectory:
    return Trajectory(env_ref="ns/e@1.0.0", image_digest="sha256:x", task_id="t", seed=7, group_id="g")


def test_each_attempt_is_told_the_failures_before_it() -> None:
    seen: list[list[str]] = []

    def attempt(n: int, failed: list[str]) -> Trajectory:
        seen.append(failed)
        if n == 0:
            raise InfraFailure("inference_unavailable", "server down")
        if n == 1:
            raise VerifierFailure("verifier_crash", "boom")
        t = _describe()
        t.reward = 1.0
        return t

    t = run_attempts(attempt, max_retries=2, describe=_describe)
    assert seen == [[], ["infra_failure:inference_unavailable"],
                    ["infra_failure:inference_unavailable", "verifier_failure:verifier_crash"]]
    assert t.reward == 1.0 and not t.excluded and t.retries == 2
    assert t.attempts == ["infra_failure:inference_unavailable", "verifier_failure:verifier_crash"]


def test_an_attempt_that_cannot_run_stops_the_retries() -> None:
    calls: list[int] = []

    def attempt(n: int, failed: list[str]) -> Trajectory:
        calls.append(n)
        if n == 0:
            raise InfraFailure("sandbox_host_lost", "host gone")
        raise StopRetrying("infra_failure:no_sandbox_host", {"message": "no live sandbox host is left"})

    t = run_attempts(attempt, max_retries=5, describe=_describe)
    assert calls == [0, 1]
    assert t.excluded and t.outcome == "infra_failure:no_sandbox_host" and t.reward is None
    assert (t.exclude_reason == "infra_failure:no_sandbox_host after 1 attempts"
            and t.attempts == ["infra_failure:sandbox_host_lost"])
    assert (t.task_id, t.seed, t.group_id) == ("t", 7, "g")


def test_a_returned_infra_outcome_is_retried_like_a_raised_one() -> None:
    def attempt(n: int, failed: list[str]) -> Trajectory:
        t = _describe()
        t.outcome = "infra_failure:container_lost" if n < 2 else "model_failure:turn_limit"
        t.reward = 0.0
        return t

    t = run_attempts(attempt, max_retries=2, describe=_describe)
    assert t.outcome == "model_failure:turn_limit" and not t.excluded and t.retries == 2 and t.reward == 0.0
