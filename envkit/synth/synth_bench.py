"""``envkit bench synth``: synthesis at scale over real packages, then a validated sample of each.

For each package: ``envkit synth pypi:NAME==VERSION`` (skipped when its folder already holds a
finished environment, so a long run can be resumed), then ``envkit validate`` on a seeded
sample with the probe set asked for. The figures: tasks, tried/kept per family, synthesis
time, bytes stored per task, the image, and per package the oracle and null results and
which probe beat how many tasks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "bench_synth", "package_row"]

# The ten packages (docs/synth.md): small, pure Python, suites that pass with pytest alone.
PACKAGES = ("isodate==0.7.2", "parse==1.22.4", "cachetools==8.0.2", "tabulate==0.10.0", "sqlparse==0.6.1",
            "more-itertools==11.2.1", "boltons==26.2.0", "tomlkit==0.15.3", "markdown==3.11.3", "pyparsing==3.3.3")


def stored_bytes(env_dir: Path) -> dict[str, int]:
    """What the environment stores per task (its line, patch, fix and recorded calls) and what
    it stores once (the project, the suite's list, the lock)."""
    per_task = sum(p.stat().st_size for folder in ("bugs", "fixes") for p in (env_dir / folder).glob("*.diff"))
    traces = next(p for p in (env_dir / "suite" / "traces.json.gz", env_dir / "suite" / "traces.json") if p.is_file())
    per_task += (env_dir / "tasks.jsonl").stat().st_size + traces.stat().st_size
    shared = sum(p.stat().st_size for p in (env_dir / "repo").rglob("*") if p.is_file())
    shared += (env_dir / "suite" / "suite.json").stat().st_size + (env_dir / "python.lock").stat().st_size
    return {"per_task_total": per_task, "shared": shared}


def package_row(env_dir: Path, validation: dict[str, Any] | None) -> dict[str, Any]:
    prov = json.loads((env_dir / "provenance.json").read_text())
    cands = prov["candidates"]
    tasks = cands["tasks"]
    sizes = stored_bytes(env_dir)
    row: dict[str, Any] = {
        "package": f"{prov['source']['name']}=={prov['source']['version']}", "tasks": tasks, "tried": cands["tried"],
        "kept": cands["kept"], "synth_s": prov["timings"]["total_s"], "baseline": prov["baseline"],
        "by_family": cands["by_family"], "dropped": cands["dropped"],
        "bytes_per_task": round(sizes["per_task_total"] / tasks) if tasks else None, "shared_bytes": sizes["shared"],
    }
    lock = env_dir / "envkit.lock"
    if lock.is_file():
        row["image_id"] = json.loads(lock.read_text())["image_id"]
    if validation is not None:
        checked = validation["tasks"]
        row["validated"] = len(checked)
        row["oracle_ok"] = sum(t["oracle_reward"] == 1.0 for t in checked)
        row["null_ok"] = sum(t["null_reward"] == 0.0 for t in checked)
        row["beaten"] = {probe: len(ts) for probe, ts in validation["probes"]["beaten"].items()}
        row["probes_run"] = validation["probes"]["run"]
        row["tasks_beaten"] = sum(1 for t in checked if any(p["beaten"] for p in t["probes"]))
        row["validate_s"] = validation["seconds"]
        row["problems"] = {t["task_id"]: t["problems"] for t in checked if t["problems"]}
    return row


def bench_synth(packages: list[str], out_dir: Path, *, max_tasks: int, sample: int, probes: str, seed: int, jobs: int,
                progress: Callable[[str], None] = lambda _m: None) -> list[dict[str, Any]]:
    from envkit.runtime import EnvRuntime
    from envkit.spec import load_environment
    from envkit.synth.pipeline import synth
    from envkit.validate import validate

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for package in packages:
        name = package.split("==")[0]
        env_dir = out_dir / name
        if not (env_dir / "provenance.json").is_file():
            progress(f"synth {package}")
            try:
                synth(f"pypi:{package}", env_dir, max_tasks=max_tasks, seed=seed, jobs=jobs)
            except Exception as e:  # noqa: BLE001 - a refused package is a row of the table, with its reason
                rows.append({"package": package, "refused": str(e)})
                write_rows(out_dir / "bench.json", rows)
                continue
        validation = None
        cached = env_dir / "validation.json"
        if sample > 0:
            if cached.is_file():
                validation = json.loads(cached.read_text())
            else:
                progress(f"validate {package}")
                t0 = time.monotonic()
                report = validate(EnvRuntime(load_environment(env_dir), sandbox_runtime="runc"), seed=seed, jobs=jobs,
                                  probes=probes, sample=sample)
                validation = report.to_dict()
                validation["wall_s"] = round(time.monotonic() - t0, 1)
                cached.write_text(json.dumps(validation))
        rows.append(package_row(env_dir, validation))
        write_rows(out_dir / "bench.json", rows)
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """``bench.json``: this run's rows after the rows an earlier run left there for other
    packages (a run over one package adds its row; it does not drop the table's others)."""
    ours = {r["package"] for r in rows}
    try:
        before = [r for r in json.loads(path.read_text()) if r.get("package") not in ours]
    except (OSError, ValueError, TypeError, AttributeError):
        before = []
    path.write_text(json.dumps(before + rows, indent=1))
