"""`envkit rollout` end to end: real vLLM (tiny model), real Docker, the bundled pyfix."""

from __future__ import annotations

import json

import pytest

from ..conftest import envkit

pytestmark = [pytest.mark.vllm, pytest.mark.docker]


def test_rollout_cli_writes_every_trajectory_once(server, tiny, tmp_path):
    out = tmp_path / "t.jsonl"
    proc = envkit("rollout", "environments/pyfix", "--model", str(tiny), "-n", "6", "-c", "3", "--group-size", "2",
                  "--max-tokens", "48", "--policy-url", server.url, "--out", str(out), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["episodes"] == len(rows) == 6
    assert sum(summary["outcomes"].values()) == 6 and summary["generated_tokens"] > 0
    assert len({(r["group_id"], r["seed"]) for r in rows}) == 3
    for r in rows:
        assert len(r["completion_token_ids"]) == len(r["logprobs"]) == len(r["weight_versions"]) == len(r["loss_mask"])
        model = [i for i, m in enumerate(r["loss_mask"]) if m]
        assert model and all(r["logprobs"][i] <= 0 and r["weight_versions"][i] for i in model)
        assert r["image_digest"].startswith("sha256:") and r["timings"]["episode_s"] > 0
        assert r["outcome"] == "ok" or r["outcome"].startswith("model_failure:")
        assert r["reward"] is not None  # nothing here was an infra failure


def test_rollout_runs_an_imported_harbor_environment(server, tiny, tmp_path):
    from envkit.base_image import find_base

    from ..harbor_tasks import UNPULLABLE, write_harbor_tasks

    write_harbor_tasks(tmp_path / "src")
    tag = find_base().tag
    mapping = [a for image in UNPULLABLE for a in ("--base-map", f"{image}={tag}")]
    imported = envkit("import", "harbor", str(tmp_path / "src"), "--out", str(tmp_path / "env"), *mapping, timeout=120)
    assert imported.returncode == 0, imported.stderr
    out = tmp_path / "t.jsonl"
    proc = envkit("rollout", str(tmp_path / "env"), "--model", str(tiny), "-n", "10", "-c", "4", "--max-tokens", "32",
                  "--policy-url", server.url, "--out", str(out), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 10 and len({r["task_id"] for r in rows}) == 10  # every task once (seed mod n)
    for r in rows:
        assert r["outcome"] == "ok" or r["outcome"].startswith("model_failure:"), r["outcome"]
        assert r["reward"] is not None and r["completion_token_ids"] and r["image_digest"].startswith("sha256:")


def test_eval_cli_gives_intervals_that_hold_their_means(server, tiny, tmp_path):
    proc = envkit("eval", "environments/pyfix", "--model", str(tiny), "-n", "8", "-c", "4", "--max-tokens", "24",
                  "--policy-url", server.url, "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = json.loads(proc.stdout)
    assert ev["episodes"] == 8 and ev["scored"] + ev["excluded"] == 8 and ev["sandbox_nodes"] == {"local": 8}
    assert sum(row["n"] for row in ev["by_task"].values()) == ev["scored"]
    for row in [ev, *ev["by_task"].values()]:
        lo, hi = row["ci95"]
        assert lo <= row["mean"] <= hi, row
    bad = envkit("eval", "environments/pyfix", "--model", str(tmp_path), timeout=120)
    assert bad.returncode == 2 and "not a model folder" in bad.stderr and "Traceback" not in bad.stderr
