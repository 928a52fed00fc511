import json

from ..conftest import envkit


def test_bench_registry_prints_both_databases():
    proc = envkit("bench", "registry", "--envs", "3", "--requests", "60", "--concurrency", "4", "--bundle-mb", "2",
                  "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rows = {r["database"]: r for r in data["rows"]}
    assert set(rows) == {"sqlite", "postgresql"}
    for r in rows.values():
        assert r["get_errors"] == 0 and 0 < r["get_p50_ms"] <= r["get_p99_ms"] and r["get_rps"] > 0
        assert r["publish_s"] > 0 and r["pull_s"] > 0 and r["bundle_mb"] >= 2
