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
    run_checks,
)
from rl_runner.metrics import StepRecord


def test_grade_boundaries_are_inclusive():
    assert [grade(x, 1.0, 2.0) for x in (None, 0.0, 1.0, 1.0001, 2.0, 2.0001)] == ["n/a", "ok", "ok", "warn", "warn", "fail"]


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


def _metrics(rows: list[dict]) -> list[StepRecord]:
    return [StepRecord.from_dict({"step": i + 1, "version": i + 1, "ttb_s": 1.0, "train": {"train_s": 1.0},
                                  "publish": {"total_s": 0.1, "served_version": i + 1},
                                  "mismatch": {"kl": 1e-5, "max_abs": 1e-4, "round_trip_ok": True},
                                  "staleness": {"kl": {"p90": 0.0}, "lag": {"0": 8}, "admitted": 8, "rejected": 0},
                                  "failures": {"by_env_version": row}}) for i, row in enumerate(rows)]


def test_reliability_counts_first_attempts_that_a_retry_saved(tmp_path: Path):
    rows = [{"envkit/pyfix@1.0.0 sha256:aaaa": {"episodes": 50, "infra_failures": 0, "retries": 2, "first_attempt_failures": 2}},
            {"envkit/pyfix@1.0.0 sha256:aaaa": {"episodes": 50, "infra_failures": 0, "retries": 1, "first_attempt_failures": 1}}]
    metrics = _metrics(rows)
    assert environment_reliability(metrics) == {"envkit/pyfix@1.0.0 sha256:aaaa": (100, 3)}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m.to_dict()) + "\n" for m in metrics))
    check = next(c for c in run_checks(tmp_path) if c.name == "environment reliability")
    assert check.status == "warn" and "3/100 (3.0%)" in check.measured  # nothing was excluded, yet 3% failed first


def test_reliability_reads_runs_written_before_first_attempts_were_counted():
    old = _metrics([{"e 1": {"episodes": 200, "infra_failures": 1, "retries": 4}}])
    assert environment_reliability(old) == {"e 1": (200, 1)}
