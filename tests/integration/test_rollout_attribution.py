"""The agent loop's attribution and retries, with a real Docker engine and a scripted
policy behind the policy client's declared seam (an httpx MockTransport that answers
/inference/v1/generate with chosen tokens). The real vLLM path is in tests/policy."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from envkit.errors import InfraFailure
from envkit.runtime import EnvRuntime
from envkit.spec import load_environment
from rl_runner.distributed.local import LocalRollouts
from rl_runner.policy.client import PolicyClient, SamplingParams
from rl_runner.policy.router import Router
from rl_runner.rollout.runner import EpisodeSpec, collect, plan, summarize
from rl_runner.rollout.trajectory import Trajectory, apply_group_rule

from .conftest import TEST_LABEL

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from rl_runner.policy.tiny import TinySpec, tokenizer_for

    return tokenizer_for(TinySpec())  # ChatML


def scripted_policy(tokenizer, turns: list[str] | None = None, *, always: str | None = None, status: int = 200):
    """A policy whose k-th generation in each episode is turns[k] (or `always`)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")

    def handler(request: httpx.Request) -> httpx.Response:
        if status != 200:
            return httpx.Response(status, text="engine dead")
        body = json.loads(request.content)
        # The prompt opens 3 messages (system, user, assistant); each turn adds tool + assistant.
        k = (body["token_ids"].count(start) - 3) // 2
        text = always if always is not None else (turns[k] if turns and k < len(turns) else "all done")
        ids = tokenizer.encode(text, add_special_tokens=False) + [end]
        choice = {"index": 0, "token_ids": ids, "finish_reason": "stop",
                  "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in ids]},
                  "weight_versions": [{"version": "v0", "start": 0, "end": len(ids)}]}
        return httpx.Response(200, json={"choices": [choice]})

    return PolicyClient("http://policy.invalid", transport=httpx.MockTransport(handler))


def runtime_for(path: Path, client) -> EnvRuntime:
    rt = EnvRuntime(load_environment(path), client=client)
    rt.backend.labels.update(TEST_LABEL)
    return rt


def bash(cmd: str) -> str:
    return "<tool>" + json.dumps({"name": "bash", "arguments": {"command": cmd}}) + "</tool>"


FIX = "sed -i 's/ordered\\[mid\\] + ordered\\[mid + 1\\]/ordered[mid - 1] + ordered[mid]/' kit/stats.py"


def local(rt, policy, tokenizer, max_retries: int = 2) -> LocalRollouts:
    """The local backend of the rollout seam, over the scripted policy."""
    from rl_runner.rollout.chat import ChatFormat

    return LocalRollouts(rt, Router([policy]), max_retries=max_retries, extra=ChatFormat(tokenizer))


def run(rt, tokenizer, policy, task="fix-median", n=1, max_retries: int = 2) -> list[Trajectory]:
    episodes = [EpisodeSpec(rt.env.task(task), i, f"{task}/{i}") for i in range(n)]
    return collect(local(rt, policy, tokenizer, max_retries), episodes, sampling=SamplingParams(max_tokens=64))


def test_a_solving_policy_gets_reward_and_aligned_tokens(pyfix_runtime, tokenizer):
    [t] = run(pyfix_runtime, tokenizer, scripted_policy(tokenizer, [bash(FIX), "done"]))
    assert t.outcome == "ok" and t.reward == 1.0 and t.turns == 2 and not t.excluded
    assert len(t.completion_token_ids) == len(t.logprobs) == len(t.weight_versions) == len(t.loss_mask)
    model = [i for i, m in enumerate(t.loss_mask) if m]
    assert model and all(t.logprobs[i] == -0.5 and t.weight_versions[i] == "v0" for i in model)
    assert all(t.weight_versions[i] == "" and t.logprobs[i] == 0.0 for i, m in enumerate(t.loss_mask) if not m)
    assert "exit 0" in tokenizer.decode(t.completion_token_ids)  # the observation was appended once, as tokens
    assert t.image_digest == pyfix_runtime.build.image_id and t.prompt_token_ids


@pytest.mark.parametrize(
    ("turns", "outcome"),
    [
        (["<tool>{not json</tool>"], "model_failure:unparseable_action"),
        (['<tool>{"name": "rm_rf", "arguments": {}}</tool>'], "model_failure:unparseable_action"),
        ([bash("sleep 30"), "done"], "model_failure:command_timeout"),
        ([bash("python3 -c 'b = bytearray(1 << 30)'"), "done"], "model_failure:oom"),
        # its detached processes fill the pids limit, then its next command cannot start: the
        # model's doing, verified and trained on, never excluded (it used to escape the loop)
        ([bash("for i in $(seq 300); do sleep 100 >/dev/null 2>&1 & done; echo filled"), bash("echo again"), "done"],
         "model_failure:pids_limit"),
    ],
)
def test_model_failures_keep_their_reward(pyfix_copy, client, tokenizer, turns, outcome):
    spec = pyfix_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace("command_timeout_s = 60", "command_timeout_s = 2")
                    .replace("memory_mb = 512", "memory_mb = 128"))
    [t] = run(runtime_for(pyfix_copy, client), tokenizer, scripted_policy(tokenizer, turns))
    assert t.outcome == outcome and t.reward == 0.0 and not t.excluded and t.retries == 0


def test_turn_and_token_limits(pyfix_copy, client, tokenizer):
    spec = pyfix_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace('network = "none"',
                                             'network = "none"\nmax_turns = 3\nmax_generated_tokens = 5000'))
    [t] = run(runtime_for(pyfix_copy, client), tokenizer, scripted_policy(tokenizer, always=bash("echo again")))
    assert t.outcome == "model_failure:turn_limit" and t.turns == 3 and t.reward == 0.0
    spec.write_text(spec.read_text().replace("max_turns = 3", "max_turns = 50")
                    .replace("max_generated_tokens = 5000", "max_generated_tokens = 40"))
    [t] = run(runtime_for(pyfix_copy, client), tokenizer, scripted_policy(tokenizer, always=bash("echo again")))
    assert t.outcome == "model_failure:token_limit" and t.reward == 0.0


class FlakyBackend:
    """Wraps a real backend; the first `fail` creations raise the infra failure Docker would."""

    def __init__(self, backend, fail: int) -> None:
        self.backend, self.fail = backend, fail

    def create(self):
        if self.fail > 0:
            self.fail -= 1
            raise InfraFailure("sandbox_start", "injected: the container did not start")
        return self.backend.create()


def test_infra_failures_are_retried_on_a_fresh_sandbox(pyfix_runtime, tokenizer):
    real = pyfix_runtime.backend
    pyfix_runtime.backend = FlakyBackend(real, fail=1)
    try:
        [t] = run(pyfix_runtime, tokenizer, scripted_policy(tokenizer, [bash(FIX), "done"]))
    finally:
        pyfix_runtime.backend = real
    assert t.outcome == "ok" and t.reward == 1.0 and t.retries == 1 and t.attempts == ["infra_failure:sandbox_start"]


def test_exhausted_retries_exclude_with_reason_and_group_rule(pyfix_runtime, tokenizer):
    real = pyfix_runtime.backend
    pyfix_runtime.backend = FlakyBackend(real, fail=3)  # the first episode's three attempts fail
    try:
        episodes = [EpisodeSpec(pyfix_runtime.env.task("fix-median"), 0, "g"),
                    EpisodeSpec(pyfix_runtime.env.task("fix-median"), 0, "g")]
        trajs = collect(local(pyfix_runtime, scripted_policy(tokenizer, [bash(FIX), "done"]), tokenizer), episodes,
                        sampling=SamplingParams(), concurrency=1)
    finally:
        pyfix_runtime.backend = real
    first, second = trajs
    assert first.excluded and first.reward is None and first.outcome == "infra_failure:sandbox_start"
    assert first.exclude_reason == "infra_failure:sandbox_start after 3 attempts" and first.retries == 2
    assert second.excluded and second.exclude_reason == "group_too_small" and second.reward == 1.0


def test_inference_server_down_is_infra_and_excluded(pyfix_runtime, tokenizer):
    [t] = run(pyfix_runtime, tokenizer, scripted_policy(tokenizer, status=503), max_retries=1)
    assert (t.excluded and t.outcome == "infra_failure:inference_unavailable"
            and t.attempts == ["infra_failure:inference_unavailable"] * 2)


def test_group_rule_keeps_groups_with_enough_members():
    mk = lambda g, ex: Trajectory("e", "i", "t", 0, g, excluded=ex)  # noqa: E731
    trajs = apply_group_rule([mk("a", True), mk("a", False), mk("a", False), mk("b", True), mk("b", False)])
    assert [t.excluded for t in trajs] == [True, False, False, True, True]
    assert trajs[4].exclude_reason == "group_too_small"


def test_summary_counts_every_trajectory_once(pyfix_runtime, tokenizer):
    episodes = plan(pyfix_runtime, 6, group_size=2)
    trajs = collect(local(pyfix_runtime, scripted_policy(tokenizer, ["done"]), tokenizer), episodes,
                    sampling=SamplingParams(), concurrency=3)
    assert [(t.task_id, t.seed) for t in trajs] == [(e.task.id, e.seed) for e in episodes]
    s = summarize(trajs, wall_s=1.0)
    assert s["episodes"] == 6 and s["outcomes"] == {"ok": 6} and s["excluded"] == 0 and s["mean_reward"] == 0.0
