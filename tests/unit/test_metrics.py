"""The step record: metrics.jsonl written before the typed records reads back typed and is
written back the same; a field an older run lacks reads as None; report and doctor find the
same numbers as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rl_runner.doctor import environment_reliability, run_checks
from rl_runner.metrics import (
    EnvVersionFailures,
    Mismatch,
    StepRecord,
    TrajectoryTimes,
    read_metrics,
)
from rl_runner.report import summarize_run

# Lines 1-2: `envkit train` of the toy recipe (sync, steps 1 and 2) before this change, the
# publication path shortened. Line 3: the same record shape in async mode with refused samples,
# a refused batch, failures and an aborted straggler. Line 4: an older version's line: no probe
# (probe_prompts: 0 wrote `mismatch: {}`), by_env_version rows before first attempts were counted.
V0 = Path(__file__).parent / "data" / "metrics-v0.jsonl"
ENV = "envkit/shellcmd@1.0.0 sha256:4df54619a60d"


def _run(tmp_path: Path) -> Path:
    shutil.copy(V0, tmp_path / "metrics.jsonl")
    return tmp_path


def test_a_metrics_jsonl_written_before_the_typed_records_reads_back_typed(tmp_path: Path) -> None:
    first, second, late, old = read_metrics(_run(tmp_path))
    assert (first.step, first.version, first.mode, first.ttb_s, first.wall_s, first.episodes) == (1, 1, "sync", 16.1266, 17.595, 64)
    assert first.batch.trajectory_s == TrajectoryTimes(p50=1.9891, p90=2.4289, p99=2.9542, max=2.9586)
    assert (first.batch.replica_requests, first.batch.sandboxes_reused, first.batch.straggler_wait_share) == ([192], 179, 0.0647)
    assert first.staleness.kl.p90 == 7.450580596923828e-09 and first.staleness.lag == {"0": 64} and first.staleness.kl_max is None
    assert first.mismatch.round_trip_ok is True and first.mismatch.tokens == 8 and first.mismatch_batch.tokens == 357
    assert first.train.model_tokens == 357 and first.publish.served_versions == ["1"] and first.publish.total_s == 0.063
    assert first.failures.by_env_version == {ENV: EnvVersionFailures(episodes=64, infra_failures=0, retries=0, first_attempt_failures=0)}
    assert first.reward.by_env == {"envkit/shellcmd@1.0.0": 0.0} and first.outcomes == {"ok": 64}
    assert second.reward.mean == 0.0 and second.episode_s.n == 64

    assert (late.mode, late.staleness.kl_max, late.staleness.rejected, late.refused_batches) == ("async", 0.05, 74, 1)
    assert late.outcomes["aborted:straggler"] == 1 and late.batch.inference_idle_share is None
    assert late.failures.by_env_version[ENV].first_attempt_failures == 3

    assert old.mismatch == Mismatch()  # `{}`: no probe ran
    assert old.failures.by_env_version[ENV].first_attempt_failures is None  # an older run lacks the field


def test_what_is_written_is_what_the_previous_version_wrote() -> None:
    lines = V0.read_text().splitlines()
    for line in lines[:3]:
        assert json.dumps(StepRecord.from_dict(json.loads(line)).to_dict(), sort_keys=True) == line  # byte for byte
    old = json.loads(lines[3])
    again = StepRecord.from_dict(old).to_dict()
    assert again["mismatch"] == {}
    old["failures"]["by_env_version"][ENV]["first_attempt_failures"] = None  # the one field it lacked, now written
    assert again == old


def test_a_missing_field_reads_as_none_and_report_and_doctor_still_run(tmp_path: Path) -> None:
    line = {"step": 7, "staleness": {"lag": {"1": 3}}, "failures": {"by_env_version": {"e 1": {"episodes": 5}}},
            "a_key_from_a_newer_version": {"x": 1}}
    r = StepRecord.from_dict(line)
    assert r.ttb_s is None and r.mode is None and r.reward.mean is None and r.staleness.kl.p90 is None
    assert r.batch.trajectory_s.p99 is None and r.publish.served_version is None and r.mismatch.round_trip_ok is None
    assert r.staleness.lag == {"1": 3} and r.failures.by_env_version["e 1"] == EnvVersionFailures(episodes=5)
    summary = summarize_run([r], None)
    assert (summary["steps"], summary["version_lag_max"], summary["rejected_stale"]) == (1, 1, 0)
    assert summary["ttb_s_p50"] is None and summary["mismatch_kl_range"] is None and summary["infra_failure_rate"] is None
    assert environment_reliability([r]) == {"e 1": (5, 0)}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    assert [c.status for c in run_checks(tmp_path)] == ["ok", "n/a", "n/a", "ok", "n/a", "n/a"]


def test_report_and_doctor_find_the_numbers_they_found_before(tmp_path: Path) -> None:
    """Pinned from the code before the typed records (dotted-path reads), on the same file."""
    run = _run(tmp_path)
    summary = summarize_run(read_metrics(run), None)
    assert summary == {
        "eval": None, "eval_before": None, "final_version": 4, "inference_idle_share_mean": 0.89545,
        "infra_failure_rate": 0.0078125, "mismatch_kl_range": [2.9802322831784522e-09, 4.6566128730773926e-09],
        "mismatch_max_abs_range": [9.5367431640625e-07, 1.5497207641601562e-06], "mode": "async",
        "model_failure_rate": 0.0078125, "publish_s_max": 0.071, "publish_s_p50": 0.067, "rejected_stale": 148,
        "reward_first": 0.0, "reward_last": 0.3125, "reward_last5_mean": 0.15625, "sandbox_utilisation_mean": 0.5159,
        "staleness_kl_max_range": [2.2351741790771484e-08, 0.0713], "staleness_kl_p50_range": [0.0, 0.0069], "steps": 4,
        "straggler_wait_share_mean": 0.06079999999999999, "trajectory_s_p99_max": 3.3103, "ttb_s_p50": 17.61855,
        "ttb_s_p90": 19.81091, "version_lag_max": 1,
    }
    checks = {c.name: (c.measured, c.status) for c in run_checks(run)}
    assert checks == {
        "batch readiness": ("TTB p50 17.6 s, p90 19.8 s; trainer waited 97% of the time", "fail"),
        "policy freshness": ("staleness KL p90 up to 0.0412 (bound 0.05), max lag 1; 148/372 samples (40%) refused as stale", "fail"),
        "numerical alignment": ("KL 2.98e-09–4.66e-09, max |Δ log-prob| 1.55e-06", "ok"),
        "environment reliability": ("first attempts failed (infra or verifier, retried ones included) "
                                    f"{ENV}: 3/320 (0.9%)", "ok"),
        "weight publication": ("0.067 s p50, 0.071 s max; version round trip 3/3 steps", "ok"),
        "evaluation precision": ("no evaluation in this run (eval.episodes: 0)", "n/a"),
    }
