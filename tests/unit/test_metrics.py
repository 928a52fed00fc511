"""The step record: metrics.jsonl written before the typed records reads back typed and is
written back the same; a field an older run lacks reads as None; report and doctor find the
same numbers as before; the GRPO recipe's record, admission and refusal bookkeeping, pinned."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest

from rl_runner.doctor import environment_reliability, run_checks
from rl_runner.metrics import (
    BatchStats,
    EnvVersionFailures,
    Mismatch,
    Signal,
    StepMetrics,
    Throughput,
    TrajectoryTimes,
    read_metrics,
)
from rl_runner.publish import PublishResult
from rl_runner.recipes.config import Recipe
from rl_runner.recipes.steps import Refused, admit, step_record, with_advantages
from rl_runner.report import summarize_run
from rl_runner.rollout.trajectory import Trajectory, read_jsonl
from rl_runner.trainer.trainer import Sample

# Lines 1-2: `envkit train` of the toy recipe (sync, steps 1 and 2) before this change, the
# publication path shortened. Line 3: the same record shape in async mode with refused samples,
# a refused batch, failures and an aborted straggler. Line 4: an older version's line: no probe
# (probe_prompts: 0 wrote `mismatch: {}`), by_env_version rows before first attempts were counted.
V0 = Path(__file__).parent / "data" / "metrics-v0.jsonl"
ENV = "envkit/shellcmd@1.0.0 sha256:4df54619a60d"
_MAPS = {"by_env", "by_env_version", "lag", "outcomes"}  # keyed by data (env, version lag, outcome), not by name


def _run(tmp_path: Path) -> Path:
    shutil.copy(V0, tmp_path / "metrics.jsonl")
    return tmp_path


def test_a_metrics_jsonl_written_before_the_typed_records_reads_back_typed(tmp_path: Path) -> None:
    first, second, late, old = read_metrics(_run(tmp_path))
    assert (first.step, first.version, first.mode, first.ttb_s, first.wall_s, first.episodes) == (
        1, 1, "sync", 16.1266, 17.595, 64)
    assert first.batch.trajectory_s == TrajectoryTimes(p50=1.9891, p90=2.4289, p99=2.9542, max=2.9586)
    assert (first.batch.replica_requests, first.batch.sandboxes_reused, first.batch.straggler_wait_share) == (
        [192], 179, 0.0647)
    assert (first.staleness.kl.p90 == 7.450580596923828e-09 and first.staleness.lag == {"0": 64}
            and first.staleness.kl_max is None)
    assert first.mismatch.round_trip_ok is True and first.mismatch.tokens == 8 and first.mismatch_batch.tokens == 357
    assert first.train.model_tokens == 357 and first.publish.served_versions == ["1"] and first.publish.total_s == 0.063
    assert first.failures.by_env_version == {ENV: EnvVersionFailures(episodes=64, infra_failures=0, retries=0,
                                                                     first_attempt_failures=0)}
    assert first.reward.by_env == {"envkit/shellcmd@1.0.0": 0.0} and first.outcomes == {"ok": 64}
    assert second.reward.mean == 0.0 and second.episode_s.n == 64

    assert (late.mode, late.staleness.kl_max, late.staleness.rejected, late.refused_batches) == ("async", 0.05, 74, 1)
    assert late.outcomes["aborted:straggler"] == 1 and late.batch.inference_idle_share is None
    assert late.failures.by_env_version[ENV].first_attempt_failures == 3

    assert old.mismatch == Mismatch()  # `{}`: no probe ran
    assert old.failures.by_env_version[ENV].first_attempt_failures is None  # an older run lacks the field


# batch fields added since the fixture's version (the assembler's backlog at a batch's close)
_BATCH_ADDED = ("in_flight_s", "in_flight_late_s", "finished_undelivered_s")


def test_what_is_written_is_what_the_previous_version_wrote() -> None:
    lines = V0.read_text().splitlines()
    for line in lines[:3]:
        out = StepMetrics.from_dict(json.loads(line)).to_dict()
        assert out.pop("throughput") == asdict(Throughput())  # fields added since: empty for an older run
        assert out["train"].pop("updated") is None
        assert out["train"].pop("kl_ref") is None
        assert out.pop("signal") == asdict(Signal())
        assert out["batch"].pop("late_trajectories") is None
        assert all(out["batch"].pop(k) is None for k in _BATCH_ADDED)
        assert json.dumps(out, sort_keys=True) == line  # byte for byte
    old = json.loads(lines[3])
    again = StepMetrics.from_dict(old).to_dict()
    again.pop("throughput")
    again["train"].pop("updated")
    again["train"].pop("kl_ref")
    again.pop("signal")
    again["batch"].pop("late_trajectories")
    for k in _BATCH_ADDED:
        again["batch"].pop(k)
    assert again["mismatch"] == {}
    old["failures"]["by_env_version"][ENV]["first_attempt_failures"] = None  # the one field it lacked, now written
    assert again == old


def test_a_missing_field_reads_as_none_and_report_and_doctor_still_run(tmp_path: Path) -> None:
    line = {"step": 7, "staleness": {"lag": {"1": 3}}, "failures": {"by_env_version": {"e 1": {"episodes": 5}}},
            "a_key_from_a_newer_version": {"x": 1}}
    r = StepMetrics.from_dict(line)
    assert r.ttb_s is None and r.mode is None and r.reward.mean is None and r.staleness.kl.p90 is None
    assert r.batch.trajectory_s.p99 is None and r.publish.served_version is None and r.mismatch.round_trip_ok is None
    assert r.staleness.lag == {"1": 3} and r.failures.by_env_version["e 1"] == EnvVersionFailures(episodes=5)
    summary = summarize_run([r], None)
    assert (summary["steps"], summary["version_lag_max"], summary["rejected_stale"]) == (1, 1, 0)
    assert (summary["ttb_s_p50"] is None and summary["mismatch_kl_range"] is None
            and summary["infra_failure_rate"] is None)
    assert environment_reliability([r]) == {"e 1": (5, 0)}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    assert [c.status for c in run_checks(tmp_path)] == ["ok", "n/a", "n/a", "ok", "n/a", "n/a", "n/a"]


def test_report_and_doctor_find_the_numbers_they_found_before(tmp_path: Path) -> None:
    """Pinned from the code before the typed records (dotted-path reads), on the same file."""
    run = _run(tmp_path)
    summary = summarize_run(read_metrics(run), None)
    assert summary == {
        "eval": None, "eval_before": None, "final_version": 4, "inference_idle_share_mean": 0.89545,
        "generated_tokens_per_s_mean": None, "trajectories_per_s_mean": None,  # not measured before
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
        "policy freshness": ("staleness KL p90 up to 0.0412 (bound 0.05), max lag 1; "
                             "148/372 samples (40%) refused as stale", "fail"),
        "numerical alignment": ("KL 2.98e-09–4.66e-09, max |Δ log-prob| 1.55e-06", "ok"),
        "environment reliability": ("first attempts failed (infra or verifier, retried ones included) "
                                    f"{ENV}: 3/320 (0.9%)", "ok"),
        "weight publication": ("0.067 s p50, 0.071 s max; version round trip 3/3 steps", "ok"),
        "learning signal": ("not recorded (a run written before envkit recorded it)", "n/a"),
        "evaluation precision": ("no evaluation in this run (eval.episodes: 0)", "n/a"),
    }


# -- the GRPO recipe's record -------------------------------------------------------------------


def _traj(group: str, reward: float | None, outcome: str = "ok", *, episode_s: float = 1.0, **kw: Any) -> Trajectory:
    t = Trajectory(env_ref="ns/e@1.0.0", image_digest="sha256:" + "ab" * 32, task_id="t", seed=0, group_id=group,
                   reward=reward, outcome=outcome, timings={"episode_s": episode_s}, **kw)
    return t


def _sample(tokens: int) -> Sample:
    return Sample([1, 2], [3] * tokens, [1] * tokens, [-0.5] * tokens, versions=["1"] * tokens)


@pytest.fixture
def step() -> dict[str, Any]:
    """An async step: five episodes (one excluded after its retries), one stale sample, one
    refused batch before it whose only episode failed in the verifier."""
    trajs = [_traj("g0", 1.0), _traj("g0", 0.0, "model_failure:turn_limit", episode_s=2.0),
             _traj("g1", 1.0, episode_s=3.0, retries=1, attempts=["infra_failure:container_lost"]),
             _traj("g1", None, "infra_failure:sandbox_start", episode_s=0.0, retries=2, excluded=True,
                   attempts=["infra_failure:sandbox_start"] * 3),
             _traj("g1", 0.5, episode_s=0.5)]
    usable = [trajs[0], trajs[1], trajs[2], trajs[4]]
    div = [{"kl": 0.01, "max_abs": 0.1, "tokens": 4}, {"kl": 0.02, "max_abs": 0.3, "tokens": 2},
           {"kl": 0.09, "max_abs": 0.9, "tokens": 5}, {"kl": 0.0, "max_abs": 0.0, "tokens": 3}]
    refused = Refused(batches=1, samples=3,
                      trajectories=[_traj("g9", None, "verifier_failure:verifier_crash", excluded=True)])
    recipe = Recipe.model_validate({"model": "m", "envs": ["environments/shellcmd"], "mode": "async"})
    return {"trajs": trajs, "usable": usable, "div": div, "refused": refused, "recipe": recipe,
            "samples": [_sample(d["tokens"]) for d in div], "lags": [0, 0, 1, 0]}


def test_admission_takes_fresh_samples_of_groups_that_keep_two(step: dict[str, Any]) -> None:
    admitted = admit(step["usable"], step["div"], step["recipe"])
    assert admitted == [True, True, False, False]  # g1: its stale sample refused leaves one member, too few
    sync = step["recipe"].model_copy(update={"mode": "sync"})
    assert admit(step["usable"], step["div"], sync) == [True] * 4
    batch = with_advantages(step["samples"], step["usable"], admitted)
    assert batch == step["samples"][:2]
    assert [s.advantage for s in batch] == pytest.approx([1.0, -1.0], abs=1e-5)


def test_refused_batches_are_counted_kept_and_end_the_run_at_twenty(step: dict[str, Any], tmp_path: Path) -> None:
    refused = Refused()
    refused.add(step["trajs"], 4, step=3, run_dir=tmp_path, kl_max=0.05)
    assert (refused.batches, refused.samples, refused.episodes) == (1, 4, 5)
    assert read_jsonl(tmp_path / "trajectories" / "step-00003-refused-1.jsonl") == step["trajs"]
    from envkit.errors import InfraFailure

    for _ in range(18):
        refused.add([], 0, step=3, run_dir=tmp_path, kl_max=0.05)
    with pytest.raises(InfraFailure, match="20 batches in a row") as e:
        refused.add(step["trajs"][:1], 1, step=3, run_dir=tmp_path, kl_max=0.05)
    assert e.value.outcome.label == "infra_failure:no_trainable_batch" and e.value.evidence["outcomes"] == {"ok": 1}


def test_the_step_record_pins_its_numbers_and_keeps_todays_keys(step: dict[str, Any]) -> None:
    first_line = json.loads(V0.read_text().splitlines()[0])
    batch = StepMetrics.from_dict(first_line).batch
    pub = PublishResult(version="2", path="runs/x/weights/v000002", write_s=0.01, pause_s=0.02, reload_s=0.03,
                        reset_cache_s=0.004, resume_s=0.005, total_s=0.069, served_version="2", served_versions=["2"])
    admitted = admit(step["usable"], step["div"], step["recipe"])
    train = {"loss": 0.5, "grad_norm": 1.5, "model_tokens": 6, "train_s": 0.25, "is_weight_mean": 1.0,
             "is_raw_max": 1.1, "is_clipped_frac": 0.0, "updated": True, "kl_ref": 0.02}
    step["trajs"][0].loss_mask = [1, 1, 0, 1]  # 3 generated tokens, 1 observation token
    step["trajs"][0].completion_token_ids = [5, 6, 7, 8]
    step["trajs"][0].logprobs = [-0.5, -1.0, -9.0, -1.5]  # the observation's token (mask 0) is not the model's
    record = step_record(step=2, version=2, recipe=step["recipe"], wall_s=12.34567, ttb_s=3.456789, step_s=4.0,
                         trajs=step["trajs"], usable=step["usable"], env_refs=["ns/e@1.0.0"], batch=batch, trainable=2,
                         refused=step["refused"], div=step["div"], lags=step["lags"], admitted=admitted,
                         mismatch=Mismatch(), train=train, publish=pub)
    d = record.to_dict()
    assert (d["step"], d["version"], d["mode"], d["wall_s"], d["ttb_s"], d["episodes"], d["trainable"]) == (
        2, 2, "async", 12.346, 3.4568, 5, 2)
    assert (d["refused_batches"], d["refused_episodes"]) == (1, 1)
    assert d["reward"] == {"mean": 0.625, "by_env": {"ns/e@1.0.0": 0.625}}
    assert d["episode_s"] == pytest.approx({"n": 5, "mean": 1.3, "p10": 0.2, "p50": 1.0, "p90": 2.6, "max": 3.0})
    assert d["outcomes"] == {"ok": 3, "model_failure:turn_limit": 1, "infra_failure:sandbox_start": 1}
    assert d["failures"] == {"infra": 2 / 6, "retried": 2 / 6, "model": 1 / 6, "verifier": 1 / 6, "by_env_version": {
        "ns/e@1.0.0 sha256:abababababab": {"episodes": 6, "infra_failures": 1, "retries": 3,
                                           "first_attempt_failures": 3}}}
    assert d["staleness"] == {"kl": pytest.approx({"n": 4, "mean": 0.03, "p10": 0.003, "p50": 0.015, "p90": 0.069,
                                                   "max": 0.09}),
                              "lag": {"0": 3, "1": 1}, "admitted": 2, "rejected": 5, "kl_max": 0.05}
    # g0 (1, 0) and g1 (1, 0.5) both have a signal; nothing unparseable; -log p of the 3 model tokens
    assert d["signal"] == {"groups": 2, "groups_with_signal": 2, "valid_actions": 1.0, "entropy": 1.0}
    assert d["mismatch"] == {}  # no probe
    assert d["mismatch_batch"] == pytest.approx({"kl": 0.08 / 9, "max_abs": 0.3, "tokens": 9})
    assert (d["train"] == train and d["publish"] == pub.to_dict()
            and d["batch"] == first_line["batch"] | {"late_trajectories": None} | dict.fromkeys(_BATCH_ADDED))
    # throughput over the step's 4 s: every episode of it, the refused batch's too
    assert d["throughput"] == {"step_s": 4.0, "generated_tokens": 3, "generated_tokens_per_s": 0.75, "trajectories": 6,
                               "trajectories_per_s": 1.5}

    def keys(node: Any, path: str = "") -> set[str]:  # dotted paths; data-keyed maps as `*`
        if not isinstance(node, dict):
            return {path}
        return set().union(*(keys(v, f"{path}.{'*' if path.rsplit('.', 1)[-1] in _MAPS else k}")
                             for k, v in node.items()))

    # a step with a probe, as line 1
    d["mismatch"] = asdict(Mismatch(kl=0.0, max_abs=0.0, tokens=1, round_trip_ok=True))
    assert keys(d) - keys(first_line) == ({f".throughput.{k}" for k in asdict(Throughput())}
                                          | {".train.updated", ".train.kl_ref", ".batch.late_trajectories"}
                                          | {f".batch.{k}" for k in _BATCH_ADDED}
                                          | {f".signal.{k}" for k in asdict(Signal())})  # added since
    assert keys(first_line) <= keys(d)


def test_the_assemblers_figures_are_the_batch_parts_fields() -> None:
    from rl_runner.batch.assembler import NAIVE, Assembler

    from .test_batch import FakeEpisodes

    asm = Assembler(FakeEpisodes(), group_size=2, groups_per_batch=2, concurrency=2, policy=NAIVE).start()
    try:
        stats = dict(asm.next_batch(timeout=30).stats)
    finally:
        asm.stop()
    times = TrajectoryTimes(**stats.pop("trajectory_s"))  # a renamed figure fails here, not in a plot
    part = BatchStats(**stats, trajectory_s=times)
    assert part.trajectories == 4 and {f.name for f in fields(BatchStats)} - set(stats) == {
        "trajectory_s", "inference_idle_share", "sandbox_utilisation", "prefix_hit_rate", "replica_requests",
        "sandboxes_created", "sandboxes_reused"}
