"""`envkit import harbor` / `export harbor` end to end on ten Harbor-format tasks the tests
write themselves (tests/harbor_tasks.py), built from their own Dockerfiles on the real engine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from envkit.agents import NullAgent, OracleAgent, ShellAgent, run_episode
from envkit.base_image import find_base
from envkit.runtime import EnvRuntime
from envkit.spec import load_environment
from envkit.validate import validate

from ..conftest import ROOT, envkit
from ..harbor_tasks import UNPULLABLE, write_harbor_tasks
from .conftest import TEST_LABEL


def base_map_args(client: Any) -> list[str]:
    tag = find_base(client).tag
    return [a for image in UNPULLABLE for a in ("--base-map", f"{image}={tag}")]


def import_tasks(client: Any, src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return envkit("import", "harbor", str(src), "--out", str(out), "--name", "harbor/testset", *base_map_args(client),
                  "--json")


@pytest.fixture(scope="module")
def imported(client: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("harbor")
    write_harbor_tasks(root / "src")
    proc = import_tasks(client, root / "src", root / "env")
    assert proc.returncode == 0, proc.stderr
    return root / "env", json.loads(proc.stdout)


@pytest.fixture(scope="module")
def runtime(client: Any, imported: tuple[Path, dict[str, Any]]) -> EnvRuntime:
    rt = EnvRuntime(load_environment(imported[0]), client=client)
    rt.backend.labels.update(TEST_LABEL)
    return rt


def test_import_maps_fields_and_lists_what_it_cannot(imported):
    env_dir, report = imported
    rows = {t["id"]: t for t in report["tasks"]}
    assert len(rows) == 10 and "fix_calc" in rows  # Fix_Calc: the id is made valid, the name kept for export
    env = load_environment(env_dir)
    fix = env.task("fix_calc")
    assert fix.params["harbor_name"] == "Fix_Calc" and fix.oracle == "tasks/fix_calc/solution/solve.sh"
    assert env.spec.environment.kind == "container" and env.spec.image.build == "dockerfile"
    hello = env.task("hello-file")
    assert hello.difficulty == "easy" and hello.container is not None
    assert (hello.container.agent_timeout_s, hello.container.verifier_timeout_s) == (120.0, 60.0)
    assert set(rows["hello-file"]["carried"]) == {"metadata.category", "metadata.tags"}
    sums = env.task("sum-numbers").container
    assert (sums is not None
            and (sums.cpus, sums.memory_mb, sums.network, sums.build_timeout_s) == (1.0, 512, "none", 300.0))
    assert env.task("verifier-env").container.verifier_env == {"EXPECTED": "42"}  # type: ignore[union-attr]
    assert env.task("as-agent-user").container.agent_user == "agent"  # type: ignore[union-attr]
    assert env.task("prebuilt-image").container.image == "alpine:3.20"  # type: ignore[union-attr]
    extras = rows["with-extras"]["unsupported"]
    assert "custom_top" in extras and "solution.env" in extras
    assert any(u.startswith("environment.storage_mb") for u in extras)
    assert any("docker-compose.yaml" in u for u in extras)
    assert all(not rows[t]["unsupported"] for t in rows if t != "with-extras")
    assert json.loads((env_dir / "harbor-import.json").read_text())["tasks"] == report["tasks"]


@pytest.mark.slow
def test_imported_environment_builds_validates_and_is_marked_not_reproducible(runtime, imported):
    env_dir, _ = imported
    lock = json.loads((env_dir / "envkit.lock").read_text())
    assert lock["reproducible"] is False and set(lock["task_images"]) == {t.id for t in runtime.env.tasks}
    assert len(set(lock["task_images"].values())) >= 9  # own images; prebuilt-image is the mapped base itself
    report = validate(runtime, jobs=2, probes="none")
    failed = [(t.task_id, t.problems) for t in report.tasks if not t.ok]
    assert not failed, failed
    assert report.ok and report.reproducible is False and report.determinism["ok"]
    assert all(t.oracle_reward == 1.0 and t.null_reward == 0.0 for t in report.tasks)


def test_bench_sandbox_on_a_container_environment_points_to_bench_episode(runtime, imported):
    proc = envkit("bench", "sandbox", "-n", "2", "--env", str(imported[0]))  # the runtime fixture built its images
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "container environment" in proc.stderr and f"envkit bench episode {imported[0]}" in proc.stderr


@pytest.mark.slow
def test_probes_show_what_harbors_trust_model_does_not_guarantee(runtime):
    """An imported task keeps Harbor's model: its tests run the agent's code in the agent's own
    container, as a user the agent's code can act as. The probes find that (docs/spec.md)."""
    report = validate(runtime, jobs=1, probes="quick", tasks=["fix_calc"])
    beaten = report.beaten()
    assert not report.ok and {"exit-zero", "always-equal"} <= set(beaten), report.to_dict()["probes"]
    assert all(tasks == ["fix_calc"] for tasks in beaten.values())
    held = set(report.probes_run) - set(beaten)
    assert {"fake-reward-answer", "disabled-tools"} <= held  # nothing to gain from the answer or missing tools
    assert set(report.probes_skipped) == {"path-escape", "off-origin"}


@pytest.mark.slow
def test_validate_cli_says_not_reproducible_and_check_recorded_compares(imported):
    env_dir, _ = imported
    proc = envkit("validate", str(env_dir), "--probes", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not reproducible" in proc.stdout and "PASS: 10/10" in proc.stdout
    assert envkit("build", str(env_dir), "--check-recorded").returncode == 0  # the cached rebuild gives the same IDs
    lock_path = env_dir / "envkit.lock"
    lock = json.loads(lock_path.read_text())
    lock["task_images"]["hello-file"] = "sha256:" + "0" * 64
    lock_path.write_text(json.dumps(lock))
    before = lock_path.read_text()
    proc = envkit("build", str(env_dir), "--check-recorded")
    assert proc.returncode == 2 and "hello-file" in proc.stderr and "not reproducible" in proc.stderr
    assert "Traceback" not in proc.stderr and lock_path.read_text() == before  # nothing overwritten
    assert envkit("build", str(env_dir)).returncode == 0  # without the check: records the new IDs
    assert json.loads(lock_path.read_text())["task_images"]["hello-file"] != "sha256:" + "0" * 64


def test_rewards_json_with_several_keys(runtime):
    task = runtime.env.task("multi-reward")
    partial = run_episode(runtime, task, 0, ShellAgent("""echo '{"total": 10}' > /app/report.json"""))
    assert partial.outcome == "ok" and partial.reward == 0.5
    assert (partial.verifier["rewards"] == {"correctness": 1.0, "shape": 0.0}
            and partial.verifier["reward_file"] == "reward.json")
    full = run_episode(runtime, task, 0, OracleAgent())
    assert full.reward == 1.0 and full.verifier["rewards"] == {"correctness": 1.0, "shape": 1.0}


def test_an_agent_past_its_timeout_is_a_model_failure_still_graded(runtime):
    result = run_episode(runtime, runtime.env.task("slow-agent"), 0, ShellAgent("sleep 30"))
    assert result.outcome == "model_failure:episode_timeout", result.evidence
    assert result.reward == 0.0 and result.steps[0].duration_s < 10  # the task's 4 s, not the spec's 600 s


def test_each_episode_gets_a_fresh_container_of_its_task(runtime):
    sandbox = runtime.backend.create()
    try:
        first = run_episode(runtime, runtime.env.task("hello-file"), 0, OracleAgent(), sandbox)
        # the oracle's file is gone
        again = run_episode(runtime, runtime.env.task("hello-file"), 0, NullAgent(), sandbox)
        other = run_episode(runtime, runtime.env.task("sum-numbers"), 0, ShellAgent("cat /app/data.txt | wc -l"),
                            sandbox)
    finally:
        sandbox.destroy()
    assert (first.reward, again.reward) == (1.0, 0.0) and first.state_hash == again.state_hash
    assert other.steps[0].stdout.strip() == "100" and other.state_hash != first.state_hash
    # the agent never sees the tests or the solution: they are copied in after (tests) or only for the oracle
    peek = run_episode(runtime, runtime.env.task("verifier-env"), 0,
                       ShellAgent("ls /tests /solution; env | grep EXPECTED"))
    assert "No such file" in peek.steps[0].stderr and "EXPECTED" not in peek.steps[0].stdout
    assert run_episode(runtime, runtime.env.task("as-agent-user"), 0,
                       ShellAgent("id -u")).steps[0].stdout.strip() == "1000"


def test_import_refuses_bad_input_clearly_and_writes_nothing(client, tmp_path):
    src = tmp_path / "src"
    [hello, *_] = write_harbor_tasks(src)
    (hello / "tests" / "test.sh").unlink()
    proc = envkit("import", "harbor", str(src), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "tests/test.sh is missing" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    proc = envkit("import", "harbor", str(src / "multi-reward"), "--out", str(tmp_path / "busy"))
    assert (proc.returncode == 2 and "not empty" in proc.stderr
            and (tmp_path / "busy" / "keep.txt").read_text() == "mine")
    proc = envkit("import", "harbor", str(src / "multi-reward"), "--out", str(tmp_path / "o2"), "--base-map",
                  "nonsense")
    assert proc.returncode == 2 and "FROM=LOCAL" in proc.stderr
    proc = envkit("import", "harbor", str(tmp_path / "busy"), "--out", str(tmp_path / "o3"))
    assert proc.returncode == 2 and "holds no Harbor task" in proc.stderr
    # Imported without --base-map: the build says which FROM to map, not a Docker traceback.
    assert envkit("import", "harbor", str(src / "multi-reward"), "--out", str(tmp_path / "nomap")).returncode == 0
    proc = envkit("build", str(tmp_path / "nomap"))
    assert proc.returncode == 2 and "python:3.12-slim" in proc.stderr and "--base-map" in proc.stderr


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_import_export_import_is_stable(client, imported, tmp_path):
    env_dir, _ = imported
    proc = envkit("export", "harbor", str(env_dir), "--out", str(tmp_path / "exported"), "--json")
    assert proc.returncode == 0, proc.stderr
    names = json.loads(proc.stdout)["tasks"]
    assert "Fix_Calc" in names and len(names) == 10  # the original folder names come back
    assert (tmp_path / "exported" / "hello-file" / "environment" / "Dockerfile").read_text().startswith(
        "FROM python:3.12-slim")
    assert import_tasks(client, tmp_path / "exported", tmp_path / "again").returncode == 0
    assert (tmp_path / "again" / "tasks.jsonl").read_text() == (env_dir / "tasks.jsonl").read_text()
    assert envkit("export", "harbor", str(tmp_path / "again"), "--out", str(tmp_path / "exported2")).returncode == 0
    assert _tree(tmp_path / "exported") == _tree(tmp_path / "exported2")
    proc = envkit("export", "harbor", str(ROOT / "environments" / "supportdesk"), "--out", str(tmp_path / "no"))
    assert proc.returncode == 2 and "not supported yet" in proc.stderr and not (tmp_path / "no").exists()


@pytest.mark.slow
def test_a_repo_environment_exports_to_harbor_and_comes_back_valid(client, tmp_path):
    """pyfix -> Harbor folders -> envkit again: every oracle still reaches 1.0 and the null agent 0.0,
    from the same seeded commit; and a second round gives the same tasks."""
    assert envkit("export", "harbor", str(ROOT / "environments" / "pyfix"), "--out",
                  str(tmp_path / "h1")).returncode == 0
    folder = tmp_path / "h1" / "fix-median"
    assert (folder / "tests" / "test.sh").is_file() and (folder / "solution" / "solve.sh").is_file()
    assert "FROM envkit/base" in (folder / "environment" / "Dockerfile").read_text()
    proc = envkit("import", "harbor", str(tmp_path / "h1"), "--out", str(tmp_path / "e1"), "--name",
                  "envkit/pyfix-harbor", "--json")
    assert proc.returncode == 0, proc.stderr
    runtime = EnvRuntime(load_environment(tmp_path / "e1"), client=client)
    runtime.backend.labels.update(TEST_LABEL)
    report = validate(runtime, jobs=2, probes="none")
    assert report.ok and len(report.tasks) == 13, [(t.task_id, t.problems) for t in report.tasks if not t.ok]
    native = EnvRuntime(load_environment(ROOT / "environments" / "pyfix"), client=client)
    head = "git rev-parse HEAD; id -un"
    a = run_episode(native, native.env.task("fix-median"), 0, ShellAgent(head)).steps[0].stdout
    b = run_episode(runtime, runtime.env.task("fix-median"), 0, ShellAgent(head)).steps[0].stdout
    assert a == b and a.split()[1] == "agent"  # the same seeded commit, worked on as the same user
    assert envkit("export", "harbor", str(tmp_path / "e1"), "--out", str(tmp_path / "h2")).returncode == 0
    assert import_tasks(client, tmp_path / "h2", tmp_path / "e2").returncode == 0
    first = [json.loads(line) for line in (tmp_path / "e1" / "tasks.jsonl").read_text().splitlines()]
    second = [json.loads(line) for line in (tmp_path / "e2" / "tasks.jsonl").read_text().splitlines()]
    assert first == second


def test_check_env_passes_on_the_imported_environment(runtime):
    from envkit.gym import EnvkitEnv, check_env

    with EnvkitEnv(runtime) as env:
        report = check_env(env)
    assert len(report["passed"]) >= 10


# -- the command channel in a task's own image (helper.py on the Python carried in by a volume)

_KILL_CHANNEL = ("for p in /proc/[0-9]*; do grep -q 'rt/v/helper[.]py' $p/cmdline 2>/dev/null && kill -9 ${p#/proc/}; "
                 "done; sleep 5")


def test_a_task_image_without_envkit_gets_the_command_channel_and_a_non_root_agent_cannot_reach_it(runtime):
    task = runtime.env.task("as-agent-user")
    sb = runtime.backend.create()
    try:
        sb.reset(0, task=task.id)
        assert sb.inner.channel_off == "" and sb.inner._root is not None  # no `docker exec` per command
        r = sb.exec("id -u; echo $HOME; getent hosts localhost >/dev/null && echo resolves")
        assert r.stdout.split() == ["1000", "/home/agent", "resolves"], r  # as `docker exec --user agent` would
        assert r.command_s is not None and 0 <= r.command_s <= r.duration_s
        attack = sb.exec(_KILL_CHANNEL.replace("; sleep 5", "; echo tried"))
        assert attack.stdout == "tried\n" and sb.exec("echo alive").stdout == "alive\n"
        assert sb.exec("id -u", user="root").stdout == "0\n"
    finally:
        sb.destroy()


def test_a_root_agent_that_stops_its_sandbox_gets_a_model_failure_not_an_excuse(runtime):
    """A container environment's agent is root by default and can stop its own sandbox (the
    channel is its main process): with the engine answering, that is the model's doing."""
    result = run_episode(runtime, runtime.env.task("hello-file"), 0, ShellAgent(_KILL_CHANNEL))
    assert result.outcome == "model_failure:sandbox_stopped" and result.reward == 0.0, result
    assert result.evidence["container"]


def test_bench_episode_measures_the_overhead_of_oracle_episodes(imported):
    env_dir, _ = imported
    proc = envkit("bench", "episode", str(env_dir), "-n", "3", "--concurrency", "2", "--json", timeout=600)
    assert proc.returncode in (0, 1), proc.stderr  # 1 = a target missed (reported, not hidden)
    data = json.loads(proc.stdout)
    assert data["failed"] == [] and data["n"] == 3 and data["kind"] == "container"
    st = data["per_episode_s"]
    assert 0 < st["commands"]["mean"] < st["wall"]["mean"]
    assert abs(st["overhead"]["mean"] - (st["wall"]["mean"] - st["commands"]["mean"])) < 1e-3
    parts = ("acquire", "reset", "agent tools", "verify", "teardown, other")
    assert abs(sum(st[p]["mean"] for p in parts) - st["overhead"]["mean"]) < 1e-3
    cpu = data["host_cpu_s_per_episode"]
    assert cpu["all"] > 0 and abs(cpu["overhead"] - (cpu["all"] - cpu["commands"])) < 1e-3
    assert set(data["targets"]) == {"overhead_s", "overhead_cpu_s"}
    bad = envkit("bench", "episode", str(env_dir / "nope"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_without_the_carried_python_a_task_runs_by_docker_exec(runtime, monkeypatch):
    monkeypatch.setattr(runtime.backend, "_volume", None)
    monkeypatch.setattr(runtime.backend, "channel_off", "no Python for the command channel (this test)")
    sb = runtime.backend.create()
    try:
        sb.reset(0, task="hello-file")
        assert sb.inner._root is None and "this test" in sb.inner.channel_off
        assert sb.exec("echo $HOME; cat /etc/hosts | head -1").stdout.split() == ["/root", "127.0.0.1", "localhost"]
    finally:
        sb.destroy()
    result = run_episode(runtime, runtime.env.task("multi-reward"), 0, OracleAgent())
    assert result.outcome == "ok" and result.reward == 1.0, result
