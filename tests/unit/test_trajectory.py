"""The trajectory record on disk: JSONL written by earlier versions reads back typed (outcomes
and failed attempts as OutcomeLabels), and what is written is the same strings as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envkit.errors import FailureCategory, OutcomeLabel
from rl_runner.rollout.trajectory import Trajectory, read_jsonl, write_jsonl

# Line 1 as `envkit train` wrote it before this change (the toy recipe, step 1); lines 2-4 the
# same record with an excluded retried episode, an aborted straggler, and a line from before
# the Ray backend (no `placement`).
V0 = Path(__file__).parent / "data" / "trajectories-v0.jsonl"


def test_a_trajectory_jsonl_in_todays_format_reads_back_typed() -> None:
    ok, excluded, aborted, old = read_jsonl(V0)
    assert (ok.env_ref, ok.task_id, ok.seed, ok.reward, ok.turns) == ("envkit/shellcmd@1.0.0", "system-info", 0, 0.0, 1)
    assert (len(ok.prompt_token_ids) == 212
            and len(ok.completion_token_ids) == len(ok.logprobs) == len(ok.loss_mask) == 10)
    assert ok.generated_tokens == 10 and ok.timings["episode_s"] == 1.4648
    assert isinstance(ok.outcome, OutcomeLabel) and ok.outcome.category is FailureCategory.OK

    assert excluded.outcome == "infra_failure:sandbox_start" and excluded.outcome.kind == "sandbox_start"
    assert excluded.outcome.retryable and excluded.excluded and excluded.reward is None and excluded.retries == 2
    assert all(isinstance(a, OutcomeLabel) and a.retryable for a in excluded.attempts)
    assert [a.kind for a in excluded.attempts] == ["sandbox_start", "container_lost", "sandbox_start"]

    assert aborted.outcome.category is FailureCategory.ABORTED and not aborted.outcome.retryable

    assert old.placement == {}  # a field the line lacks takes its default
    assert old.outcome.category is FailureCategory.MODEL and old.reward == 0.0


def test_what_is_written_is_the_same_strings_as_before(tmp_path: Path) -> None:
    before = V0.read_text().splitlines()
    after = write_jsonl(tmp_path / "t.jsonl", read_jsonl(V0)).read_text().splitlines()
    # fields since, at their defaults
    added = {"bundle_digest": "", "runtime": "", "verifier": {}, "attempt_evidence": [], "late": False}
    for i in range(3):
        assert json.loads(after[i]) == {**json.loads(before[i]), **added}
    assert json.loads(after[3]) == {**json.loads(before[3]), "placement": {}, **added}


def test_the_outcome_is_parsed_however_it_is_set() -> None:
    t = Trajectory(env_ref="ns/e@1.0.0", image_digest="sha256:x", task_id="t", seed=0, group_id="g")
    assert isinstance(t.outcome, OutcomeLabel) and t.outcome == "ok"
    t.outcome = "verifier_failure:bad_output"
    assert isinstance(t.outcome, OutcomeLabel) and t.outcome.category is FailureCategory.VERIFIER
    assert Trajectory.from_dict({**t.to_dict(), "a_key_from_a_newer_version": 1}) == t
    with pytest.raises(ValueError, match="is not an outcome"):
        t.outcome = "infra:container_lost"
