"""`envkit bench rollout` end to end on a small scale: two real vLLM replicas (CPU build),
real Docker sandboxes of the repo environment, the ablation's two ends (naive and optimized) on
the same seeded workload; the rows between add one switch each (tests/unit/test_batch.py) and
run the same code, so they are not run here. Asserts the table's contents and accounting,
never the timings' values (those belong to the benchmark's own run, docs/bench.md)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from ..conftest import envkit

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.slow]


_cli = functools.partial(envkit, timeout=1500)  # the CLI, with room for a benchmark run


def _table(result: dict) -> str:
    """The human table `envkit bench rollout` prints for a result, as text."""
    from envkit.cli.bench_cmd import show_rollout
    from envkit.cli.output import console

    width, console.width = console.width, 400  # no line wrapping in the captured text
    try:
        with console.capture() as out:
            show_rollout(result, Path("runs/bench/x.json"))
    finally:
        console.width = width
    return out.get()


@pytest.mark.timeout(1800)
def test_bench_rollout_runs_naive_and_optimized_on_the_same_work(tiny: Path):
    proc = _cli("bench", "rollout", "-n", "8", "--group-size", "4", "--concurrency", "4", "--batches", "1",
                "--replicas", "2", "--time-scale", "0.05", "--policies", "naive,optimized", "--model", str(tiny),
                "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    assert [r["policy"] for r in rows] == ["naive", "optimized"]
    for r in rows:
        _holds_its_groups(r)
        assert r["retries"] <= 2, (r["policy"], r["retries"])  # an infra failure is retried, and shown; not more
        assert r["excluded"] == 0 and r["outcomes"] == ["ok"], (r["policy"], r["exclusions"])
        assert len(r["ttb_per_batch_s"]) == 1 and r["ttb_s"] > 0 and r["ideal_s"] > 0
        assert r["ttb_over_ideal"] == pytest.approx(r["ttb_s"] / r["ideal_s"], rel=1e-2)
        t = r["trajectory_s"]
        assert 0 < t["p50"] <= t["p90"] <= t["p99"]
        for share in ("straggler_wait_share", "slot_idle_share", "inference_idle_share", "sandbox_utilisation"):
            assert 0 <= r[share] <= 1, (share, r)
        assert r["prefix_cache"]["replicas"] == 2 and r["prefix_cache"]["prompt_tokens"] > 0
        assert sum(r["prefix_cache"]["requests"]) > 0
        # every command sleeps its drawn duration, and a trajectory's work holds its commands and more
        assert r["work_stretch"] >= r["command_stretch"] >= 1.0, r
        cpu = r["host_cpu_s_per_trajectory"]
        assert cpu["all"] > 0 and cpu["inference"] is None and cpu["sandboxes"] is None  # cores shared in this run
    naive, optimized = rows
    assert naive["sandboxes"]["kind"] == "fresh" and naive["sandboxes"]["reused"] == 0
    assert naive["sandboxes"]["created"] == 8  # one container per episode
    # a pool of 6 for 8 episodes: reuse is certain (a pool that made a replacement for a sandbox under its
    # health check reused none, 2a7970e's failure, caught here)
    assert optimized["sandboxes"]["kind"] == "pool" and optimized["sandboxes"]["reused"] > 0
    # the pool was full before the first batch was asked for, and the time it took is reported beside
    assert naive["pool_fill_s"] is None and optimized["pool_fill_s"] > 0
    assert optimized["ttb_over_ideal_with_fill"] > optimized["ttb_over_ideal"]
    assert naive["speedup_vs_naive"] == 1.0
    assert optimized["prefix_cache"]["affinity"] is True and naive["prefix_cache"]["affinity"] is False
    assert out["ratio"] == pytest.approx(optimized["ttb_s"] / naive["ttb_s"], rel=1e-3)
    assert set(out["targets"]) == {"optimized_le_naive_over_3_5", "optimized_within_1_3_ideal"}
    assert out["setup"]["workload"]["time_scale"] == 0.05
    assert [r["policy"] for r in out["replay"]] == ["naive", "optimized"]  # the replay of the same policies
    # two replicas on two cores leave none for the sandboxes: auto shares them, one core per replica, and says so
    part = out["setup"]["partition"]
    assert part["sandboxes"] is None and part["replicas"] == ["0", "1"] and "none left for sandboxes" in part["how"]
    text = _table(out)  # what the command prints without --json, for the same result
    assert "envkit bench rollout" in text and "ideal bound" in text and "optimized" in text
    assert f"warm pool ({out['setup']['pool_size']}) was filled in" in text


def _holds_its_groups(r: dict) -> None:
    """One batch of 8 in groups of 4: whole groups give 2 groups, 8 trajectories; with partial
    groups (0.75) a group enters once 3 of its 4 are done and the batch still holds the 8 asked
    for, so 8 to 11 (at most a group's 3 over) from 2 or 3 groups, and their other members are late."""
    if r["switches"]["partial"] >= 1:
        assert r["trajectories"] == 8 and r["late"] == 0, r
    else:
        assert 8 <= r["trajectories"] <= 11, r
        assert r["late"] == 0  # one batch: no later batch for a late member to join
        assert r["trajectories"] + r["late_undelivered"] <= 12, r


@pytest.mark.timeout(1200)
def test_bench_rollout_on_a_local_ray_cluster_prints_the_same_table(tiny: Path):
    args = ("bench", "rollout", "-n", "8", "--group-size", "4", "--concurrency", "4", "--batches", "1", "--replicas",
            "1", "--time-scale", "0.05", "--policies", "naive,optimized", "--model", str(tiny), "--backend", "ray")
    proc = _cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["setup"]["backend"] == "ray"
    rows = out["rows"]
    assert [r["policy"] for r in rows] == ["naive", "optimized"]
    for r in rows:
        _holds_its_groups(r)
        assert r["excluded"] == 0 and r["outcomes"] == ["ok"], (r["policy"], r["exclusions"])
        assert len(r["placement"]) == 2, r["placement"]  # both sandbox hosts (node processes) served episodes
        assert r["sandboxes"]["hosts"] == 2
        assert 0 <= r["inference_idle_share"] < 1 and 0 < r["sandbox_utilisation"] <= 1, r
        assert r["prefix_cache"]["prompt_tokens"] > 0 and sum(r["prefix_cache"]["requests"]) > 0
        cpu = r["host_cpu_s_per_trajectory"]  # per side of the partition, adding up to the whole
        assert cpu["inference"] > 0 and cpu["sandboxes"] > 0
        assert cpu["all"] == pytest.approx(cpu["inference"] + cpu["sandboxes"], abs=0.002)
    assert rows[0]["sandboxes"]["kind"] == "fresh" and rows[0]["sandboxes"]["created"] == 8
    assert rows[1]["sandboxes"]["kind"] == "pool" and rows[1]["pool_fill_s"] > 0  # both hosts' pools filled first
    # the default partition on this 2-core machine: the replica on core 0, every sandbox (on both Ray hosts) on core 1
    assert out["setup"]["partition"] == {"inference": "0", "sandboxes": "1", "replicas": ["0"], "how": "auto"}
    # the same keys as the local backend's rows
    local_keys = {"policy", "ttb_s", "ttb_per_batch_s", "ideal_s", "ttb_over_ideal", "trajectory_s",
                  "straggler_wait_share", "slot_idle_share", "inference_idle_share", "sandbox_utilisation", "sandboxes",
                  "prefix_cache", "trajectories", "excluded", "retries", "outcomes", "exclusions", "placement",
                  "aborted", "left_groups"}
    assert local_keys <= set(rows[0])
    text = _table(out)
    assert ("ray backend" in text and "ideal bound" in text
            and "cores: inference 0 (replica 0: 0), sandboxes 1 (auto)" in text)


def test_bench_rollout_refuses_bad_input_before_starting_anything():
    proc = _cli("bench", "rollout", "-n", "10", "--group-size", "4", timeout=120)
    assert proc.returncode == 2 and "multiple of --group-size" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("bench", "rollout", "--policies", "fastest", timeout=120)
    assert proc.returncode == 2 and "--policies" in proc.stderr
    proc = _cli("bench", "rollout", "--backend", "slurm", timeout=120)
    assert proc.returncode == 2 and "--backend" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("bench", "rollout", "--ray-address", "127.0.0.1:1", timeout=120)
    assert proc.returncode == 2 and "--backend ray" in proc.stderr
    proc = _cli("bench", "rollout", "--cpu-partition", "0/1", "--replicas", "2", timeout=120)
    assert proc.returncode == 2 and "2 vLLM replicas need a core each" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("bench", "rollout", "--cpu-partition", "0-1/", timeout=120)
    assert proc.returncode == 2 and "leaves no core for the sandboxes" in proc.stderr and "Traceback" not in proc.stderr
