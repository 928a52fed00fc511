"""Chaos: 64 episodes against real vLLM (tiny model) and real Docker, with seeded faults
injected at known points. Every injected infra fault must be attributed to infra and every
injected model fault to the model; no trajectory is lost or counted twice; the run completes."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from envkit.errors import FailureCategory
from envkit.runtime import EnvRuntime
from envkit.spec import load_environment
from rl_runner.distributed.local import LocalRollouts
from rl_runner.policy.client import PolicyClient, SamplingParams
from rl_runner.policy.router import Router
from rl_runner.rollout.chaos import INFRA_FAULTS, MODEL_FAULTS, ChaosInjector
from rl_runner.rollout.runner import collect, plan, summarize

from ..conftest import PYFIX

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.slow]

RATES = {"kill_container": 0.08, "docker_api": 0.08, "verifier_crash": 0.08, "vllm_restart": 0.02,
         "model_timeout": 0.08, "model_unparseable": 0.08, "model_hangs_verifier": 0.06, "model_forges_reward": 0.06}


def test_chaos_attribution(server, tiny, tmp_path):
    from transformers import AutoTokenizer

    from rl_runner.rollout.chat import ChatFormat

    env_dir = tmp_path / "pyfix"
    shutil.copytree(PYFIX, env_dir, ignore=shutil.ignore_patterns("envkit.lock"))
    spec = env_dir / "envkit.toml"
    spec.write_text(spec.read_text().replace("command_timeout_s = 60", "command_timeout_s = 2")
                    .replace("--tests /env/verify/tests", "--tests /env/verify/tests --call-timeout 3"))
    runtime = EnvRuntime(load_environment(env_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    chaos = ChaosInjector(seed=7, rates=RATES, server=server)
    chaos.wrap_runtime(runtime)
    real_policy = PolicyClient(server.url, timeout=120)
    policy = chaos.wrap_policy(real_policy, tokenizer)
    episodes = plan(runtime, 64, group_size=4)
    rollouts = LocalRollouts(runtime, Router([policy]), max_retries=2, extra=ChatFormat(tokenizer),
                             policy_ready=server.healthy)
    trajs = collect(rollouts, episodes, sampling=SamplingParams(max_tokens=24), concurrency=4, on_attempt=chaos.begin)
    real_policy.close()

    # Nothing lost, nothing twice: one trajectory per planned episode, in order.
    assert len(trajs) == 64
    assert [(t.task_id, t.seed, t.group_id) for t in trajs] == [(e.task.id, e.seed, e.group_id) for e in episodes]
    injected = {(i, a): f for i, a, f in chaos.ledger}
    kinds = Counter(f for f in injected.values())
    outage = "vllm_restart" in kinds  # an outage fails other in-flight episodes too: infra, and retried
    assert all(kinds[f] >= 1 for f in ("kill_container", "docker_api", "verifier_crash", "model_timeout",
                                       "model_unparseable", "model_hangs_verifier", "model_forges_reward")), kinds

    for (i, attempt), fault in injected.items():
        t = trajs[i]
        if fault in INFRA_FAULTS:  # recall: the injected attempt failed as infra, and was retried
            assert attempt == 0 and t.attempts, (i, fault, t.outcome, t.attempts)
            assert t.attempts[0].retryable, (i, fault, t.attempts)
        else:  # model faults keep their reward and are never taken for infra
            assert t.outcome == MODEL_FAULTS[fault], (i, fault, t.outcome, t.evidence)
            assert t.reward is not None and not t.excluded, (i, fault, t.attempts)
            # neither dodges nor forges: the seeded bugs earn 0
            if fault in ("model_hangs_verifier", "model_forges_reward"):
                assert t.reward == 0.0, (i, fault, t.reward, t.evidence)
            assert all(outage and a == "infra_failure:inference_unavailable"
                       for a in t.attempts), (i, fault, t.attempts)
    # precision: no episode without an injected fault was attributed to infra, unless it was
    # caught in the inference outage a vllm_restart caused (which is infra too)
    for i, t in enumerate(trajs):
        if (i, 0) not in injected:
            for a in t.attempts:
                assert outage and a == "infra_failure:inference_unavailable", (i, t.attempts)
        if t.outcome.category is FailureCategory.MODEL and (i, 0) not in injected:
            assert t.outcome in ("model_failure:unparseable_action", "model_failure:turn_limit",
                                 "model_failure:token_limit")
    summary = summarize(trajs, wall_s=1.0)
    assert summary["episodes"] == 64
    assert summary["excluded"] <= sum(1 for f in injected.values() if f == "vllm_restart") * 64
