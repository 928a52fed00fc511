"""`envkit doctor`'s thresholds, pinned: each check's ok / warn / fail boundaries, and the
reliability check counting first attempts (retried failures included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_runner.doctor import (
    environment_reliability,
    grade,
    grade_alignment,
    grade_batch,
    grade_eval,
    grade_freshness,
    grade_publication,
    grade_reliability,
    grade_signal,
    run_checks,
)
from rl_runner.metrics import StepMetrics


def test_grade_boundaries_are_inclusive():
    assert [grade(x, 1.0, 2.0) for x in (None, 0.0, 1.0, 1.0001, 2.0, 2.0001)] == [
        "n/a", "ok", "ok", "warn", "warn", "fail"]


@pytest.mark.parametrize(("fn", "cases"), [
    (grade_batch, {0.5: "ok", 0.51: "warn", 0.8: "warn", 0.81: "fail"}),
    (grade_alignment, {1e-3: "ok", 2e-3: "warn", 1e-2: "warn", 1.1e-2: "fail"}),
    (grade_reliability, {0.0: "ok", 0.01: "ok", 0.011: "warn", 0.05: "warn", 0.051: "fail"}),
    (grade_eval, {0.05: "ok", 0.06: "warn", 0.1: "warn", 0.11: "fail"}),
])
def test_thresholds(fn, cases):
    assert {x: fn(x) for x in cases} == cases


def test_freshness_judges_the_kl_as_well_as_the_refused_share():
    assert grade_freshness(None, 0.0, 0.05) == "n/a"
    assert grade_freshness(0.04, 0.0, 0.05) == "ok"
    assert grade_freshness(0.06, 0.0, 0.05) == "warn"  # nothing refused, but the admitted samples are stale
    assert grade_freshness(0.11, 0.0, 0.05) == "fail"
    assert grade_freshness(0.01, 0.2, 0.05) == "warn"
    assert grade_freshness(0.01, 0.31, 0.05) == "fail"
    assert grade_freshness(0.06, 0.31, 0.05) == "fail"  # the worse of the two


def test_publication():
    assert grade_publication([], True) == "n/a"
    assert grade_publication([True, True], True) == "ok"
    assert grade_publication([True, True], False) == "warn"
    assert grade_publication([True, False], True) == "fail"


def _metrics(rows: list[dict]) -> list[StepMetrics]:
    return [StepMetrics.from_dict({"step": i + 1, "version": i + 1, "ttb_s": 1.0, "train": {"train_s": 1.0},
                                  "publish": {"total_s": 0.1, "served_version": i + 1},
                                  "mismatch": {"kl": 1e-5, "max_abs": 1e-4, "round_trip_ok": True},
                                  "staleness": {"kl": {"p90": 0.0}, "lag": {"0": 8}, "admitted": 8, "rejected": 0},
                                  "failures": {"by_env_version": row}}) for i, row in enumerate(rows)]


def test_reliability_counts_first_attempts_that_a_retry_saved(tmp_path: Path):
    rows = [{"envkit/pyfix@1.0.0 sha256:aaaa": {"episodes": 50, "infra_failures": 0, "retries": 2,
                                                "first_attempt_failures": 2}},
            {"envkit/pyfix@1.0.0 sha256:aaaa": {"episodes": 50, "infra_failures": 0, "retries": 1,
                                                "first_attempt_failures": 1}}]
    metrics = _metrics(rows)
    assert environment_reliability(metrics) == {"envkit/pyfix@1.0.0 sha256:aaaa": (100, 3)}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m.to_dict()) + "\n" for m in metrics))
    check = next(c for c in run_checks(tmp_path) if c.name == "environment reliability")
    assert check.status == "warn" and "3/100 (3.0%)" in check.measured  # nothing was excluded, yet 3% failed first


def test_reliability_reads_runs_written_before_first_attempts_were_counted():
    old = _metrics([{"e 1": {"episodes": 200, "infra_failures": 1, "retries": 4}}])
    assert environment_reliability(old) == {"e 1": (200, 1)}


def _signal_run(tmp_path: Path, steps: list[tuple[int, float, float, float]]) -> list[StepMetrics]:
    """(groups with a signal of 8, mean reward, share of parsed actions, entropy) per step."""
    metrics = _metrics([{}] * len(steps))
    for m, (with_signal, reward, valid, entropy) in zip(metrics, steps, strict=True):
        (m.signal.groups, m.signal.groups_with_signal, m.signal.valid_actions,
         m.signal.entropy) = 8, with_signal, valid, entropy
        m.reward.mean = reward
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m.to_dict()) + "\n" for m in metrics))
    return metrics


def test_learning_signal_fails_a_run_without_a_gradient_and_names_the_cause(tmp_path: Path):
    # the collapse issue 31 describes: 0.031 at step 1, then every group all 0
    _signal_run(tmp_path, [(2, 0.031, 1.0, 0.6)] + [(0, 0.0, 1.0, 0.5)] * 5)
    check = next(c for c in run_checks(tmp_path) if c.name == "learning signal")
    assert check.status == "fail", check
    assert "steps without one: 2-6" in check.measured and "no episode was rewarded" in check.measured, check.measured
    assert "2/48 groups" in check.measured


def test_learning_signal_causes():
    quiet = [0.0] * 5
    assert grade_signal(quiet, [0.1] * 5, [0.9, 0.6, 0.4, 0.2, 0.1], [0.5] * 5) == ("fail", grade_signal(
        quiet, [0.1] * 5, [0.1] * 5, [0.5] * 5)[1])
    assert "stopped parsing" in grade_signal(quiet, [0.1] * 5, [0.9, 0.6, 0.4, 0.2, 0.1], [0.5] * 5)[1]
    assert "nothing is left to learn" in grade_signal(quiet, [1.0] * 5, [1.0] * 5, [0.5] * 5)[1]
    assert "near-deterministic" in grade_signal(quiet, [0.5] * 5, [1.0] * 5, [0.01] * 5)[1]
    assert "group_size" in grade_signal(quiet, [0.5] * 5, [1.0] * 5, [0.5] * 5)[1]
    # envkit bench learn, shellcmd at lr 2e-3, seed 2: rose to 0.53, fell to 0.02 with a signal in most steps
    rose_and_fell = [0.06, 0.13, 0.39, 0.16, 0.01, 0.0, 0.01, 0.15, 0.37, 0.36, 0.51, 0.53, 0.49, 0.51, 0.1, 0.02]
    status, cause = grade_signal([0.5] * 16, rose_and_fell, [1.0] * 16, [0.5] * 16)
    assert status == "warn" and "rose to 0.53 (step 12) and fell back to 0.06" in cause and "trainer.lr" in cause
    # the same values rising
    assert grade_signal([0.5] * 16, sorted(rose_and_fell), [1.0] * 16, [0.5] * 16) == ("ok", "")
    # shellcmd at lr 3e-2 (30x the recipe's): nothing rewarded after step 1, the entropy from 0.62 to 3.6 per token
    status, cause = grade_signal([0.02] + [0.0] * 7, [0.016] + [0.0] * 7, [1.0] * 8,
                                 [0.62, 1.5, 2.4, 3.0, 3.3, 3.5, 3.6, 3.6])
    assert status == "fail" and "entropy rose from 0.62 to 3.60" in cause, cause
    # and with no gradient left for 5 steps it fails, with the same cause
    assert grade_signal([0.5] * 4 + [0.0] * 5, [0.1, 0.4, 0.6, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0],
                        [1.0] * 9, [0.5] * 9)[0] == "fail"
    assert "rose to 0.60" in grade_signal([0.5] * 4 + [0.0] * 5, [0.1, 0.4, 0.6, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0],
                                          [1.0] * 9, [0.5] * 9)[1]


def test_learning_signal_thresholds():
    rising = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert grade_signal([], [], [], []) == ("n/a", "")
    assert grade_signal([0.5] * 6, rising, [1.0] * 6, [0.5] * 6) == ("ok", "")
    assert grade_signal([0.5] * 4 + [0.0] * 2, rising, [1.0] * 6, [0.5] * 6)[0] == "warn"  # 2 quiet steps at the end
    assert grade_signal([0.5] * 5 + [0.0], rising, [1.0] * 6, [0.5] * 6)[0] == "ok"  # one is noise
    assert grade_signal([0.2] * 6, rising, [1.0] * 6, [0.5] * 6)[0] == "warn"  # < 25% of groups
    assert grade_signal([0.5] * 6, rising, [1.0] * 5 + [0.7], [0.5] * 6)[0] == "warn"  # actions stopped parsing
    flat = grade_signal([0.5] * 6, [0.3] * 6, [1.0] * 6, [0.5] * 6)
    assert flat[0] == "warn" and "group_size" in flat[1]  # the reward did not move


def test_learning_signal_reads_runs_written_before_it_was_recorded(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m.to_dict()) + "\n" for m in _metrics([{}] * 3)))
    check = next(c for c in run_checks(tmp_path) if c.name == "learning signal")
    assert check.status == "n/a" and "not recorded" in check.measured
