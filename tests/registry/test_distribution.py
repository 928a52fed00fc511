"""`envkit login/publish/pull/search` and registry refs in `envkit run`, end to end with a
real Docker engine and a live registry (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from envkit.spec import load_environment

from ..conftest import PYFIX, ROOT, envkit
from .bundles import put

pytestmark = pytest.mark.docker


def unique_pyfix(tmp_path: Path, name: str) -> Path:
    """A pyfix copy under its own name and with its own content (its own image)."""
    folder = tmp_path / name
    shutil.copytree(PYFIX, folder, ignore=shutil.ignore_patterns("envkit.lock"))
    spec = folder / "envkit.toml"
    spec.write_text(spec.read_text().replace('name = "envkit/pyfix"', f'name = "envkit/{name}"'))
    (folder / "repo" / "UNIQUE").write_text(uuid.uuid4().hex)
    return folder


def test_login_publish_search_pull_run(registry, cli_env, tmp_path):
    env = {k: v for k, v in cli_env.items() if k != "ENVKIT_TOKEN"}
    login = envkit("login", registry.url, "--token", "-", stdin=registry.token + "\n", env=env)
    assert login.returncode == 0, login.stderr
    assert "as alice" in login.stdout
    creds = Path(env["XDG_CONFIG_HOME"]) / "envkit" / "credentials.json"
    assert creds.stat().st_mode & 0o777 == 0o600

    folder = unique_pyfix(tmp_path, "remote-pyfix")
    pub = envkit("publish", str(folder), "--json", env=env)
    assert pub.returncode == 0, pub.stderr
    published = json.loads(pub.stdout)
    assert published["created"] and published["ref"] == "envkit/remote-pyfix@1.0.0"
    again = json.loads(envkit("publish", str(folder), "--json", env=env).stdout)
    assert again["created"] is False and again["image_id"] == published["image_id"]

    found = json.loads(envkit("search", "remote", "--json", env=env).stdout)
    assert found["count"] == 1 and found["data"][0]["full_name"] == "envkit/remote-pyfix"

    # Pull on a "fresh" machine: remove the local image, then pull rebuilds and verifies it.
    import docker

    docker.from_env().images.remove(published["image_id"], force=True)
    pulled = envkit("pull", "envkit/remote-pyfix", "--json", env=env)
    assert pulled.returncode == 0, pulled.stderr
    result = json.loads(pulled.stdout)
    assert result["image_id"] == published["image_id"] and result["source"] == "rebuilt"
    assert result["bundle_digest"] == published["bundle_digest"]
    assert load_environment(result["folder"]).ref == "envkit/remote-pyfix@1.0.0"

    # run/validate accept registry refs: from a folder with no local environments at all.
    run = envkit("run", "envkit/remote-pyfix@1.0.0", "--task", "fix-median", "--agent", "oracle", "--json",
                 cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["reward"] == 1.0
    assert json.loads(run.stdout)["runtime"] == "gvisor"  # someone else's environment: gVisor by default
    local = envkit("run", "environments/pyfix", "--task", "fix-median", "--agent", "null", "--json", env=env)
    assert json.loads(local.stdout)["runtime"] == "runc"  # a local folder: runc


def test_pull_detects_an_image_mismatch(registry, cli_env, tmp_path):
    from envkit.bundle import make_bundle

    folder = unique_pyfix(tmp_path, "liar")
    bundle = make_bundle(load_environment(folder))
    claimed = "sha256:" + "c" * 64
    with registry.client(registry.token) as c:
        assert put(c, bundle, name="liar", image=claimed).status_code == 201
    proc = envkit("pull", "envkit/liar@1.0.0", env=cli_env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert claimed in proc.stderr and "rebuilt" in proc.stderr and "sha256:" in proc.stderr.replace(claimed, "")


def test_pull_unknown_and_unreachable(registry, cli_env, tmp_path):
    proc = envkit("pull", "envkit/nothing-here", env=cli_env)
    assert proc.returncode == 2 and "doesn't exist" in proc.stderr
    down = {**cli_env, "ENVKIT_REGISTRY_URL": "http://127.0.0.1:9"}
    proc = envkit("search", env=down)
    assert proc.returncode == 2 and "does not answer" in proc.stderr and "Traceback" not in proc.stderr


def test_publish_without_rights(registry, cli_env, tmp_path):
    folder = unique_pyfix(tmp_path, "forbidden")
    proc = envkit("publish", str(folder), env={**cli_env, "ENVKIT_TOKEN": registry.other_token})
    assert proc.returncode == 2 and "namespace `envkit`" in proc.stderr


def test_validate_reports_health_to_the_registry(registry, cli_env, tmp_path):
    folder = unique_pyfix(tmp_path, "reported")
    assert envkit("publish", str(folder), env=cli_env).returncode == 0
    # --runtime runc: a pulled environment's default is gVisor (checked by the pull-and-run tests above),
    # which makes this validation 40 s slower and tells nothing more about health reports
    proc = envkit("validate", "envkit/reported@1.0.0", "--report", "--task", "fix-median", "--task", "fix-slugify",
                  "--runtime", "runc", cwd=tmp_path, env=cli_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reported to" in proc.stdout
    with registry.client() as anon:
        health = anon.get("/environments/envkit/reported/versions/1.0.0").json()["health"]
    assert health["reports"] == 1 and health["episodes"] == 4
    assert health["oracle_pass_rate"] == 1.0 and health["infra_failures"] == {} and health["model_failures"] == 0
    assert 0 < health["p50_episode_s"] <= health["p95_episode_s"]
    probes = health["probes"]  # the default probes' results travel with the report
    assert probes["set"] == "quick" and probes["tasks"] == 2 and probes["beaten"] == {} and probes["episodes"] >= 20
    assert probes["skipped"]["path-escape"] == "the environment offers no http tool"


def test_publish_and_pull_an_imported_harbor_environment(registry, cli_env, tmp_path):
    from envkit.base_image import find_base
    from envkit.harbor import import_harbor

    from ..harbor_tasks import UNPULLABLE, write_harbor_tasks

    write_harbor_tasks(tmp_path / "src")
    tag = find_base().tag
    import_harbor([tmp_path / "src"], tmp_path / "env", name="envkit/harbor-shared",
                  base_map=dict.fromkeys(UNPULLABLE, tag))
    refused = envkit("publish", str(tmp_path / "env"), "--oci", "127.0.0.1:1", env=cli_env)
    assert refused.returncode == 2 and "one image per task" in refused.stderr
    pub = envkit("publish", str(tmp_path / "env"), "--json", env=cli_env)
    assert pub.returncode == 0, pub.stderr
    published = json.loads(pub.stdout)
    with registry.client() as c:
        assert c.get("/environments/envkit/harbor-shared/versions/1.0.0").json()["reproducible"] is False
    pulled = envkit("pull", "envkit/harbor-shared@1.0.0", "--json", env=cli_env)
    assert pulled.returncode == 0, pulled.stderr
    result = json.loads(pulled.stdout)
    assert (result["source"].startswith("rebuilt from Dockerfiles")
            and result["bundle_digest"] == published["bundle_digest"])
    run = envkit("run", "envkit/harbor-shared@1.0.0", "--task", "multi-reward", "--agent", "oracle", "--json",
                 cwd=tmp_path, env=cli_env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["reward"] == 1.0 and json.loads(run.stdout)["runtime"] == "gvisor"


def synthesized_copy(tmp_path: Path, count: int) -> Path:
    """environments/isodate (envkit synth's) grown to ``count`` tasks: its tasks repeated under
    new ids, each with its own patch and fix files."""
    folder = tmp_path / f"iso-{count}"
    shutil.copytree(ROOT / "environments" / "isodate", folder,
                    ignore=shutil.ignore_patterns("envkit.lock", "validation.json"))
    spec = folder / "envkit.toml"
    spec.write_text(spec.read_text().replace('name = "synth/isodate"', 'name = "envkit/iso-many"'))
    base = [json.loads(line) for line in (folder / "tasks.jsonl").read_text().splitlines()]
    lines = []
    for i in range(count):
        task, new_id = base[i % len(base)], f"{i:04d}-{base[i % len(base)]['id'][5:]}"[:64]
        for key, folder_name in (("patch", "bugs"), ("oracle", "fixes")):
            shutil.copyfile(folder / task[key], folder / folder_name / f"{new_id}.diff")
        lines.append(json.dumps({**task, "id": new_id, "patch": f"bugs/{new_id}.diff",
                                 "oracle": f"fixes/{new_id}.diff"}))
    for old in base:
        if old["id"] not in {json.loads(line)["id"] for line in lines}:
            (folder / old["patch"]).unlink()
            (folder / old["oracle"]).unlink()
    (folder / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_publish_and_pull_a_synthesized_environment_of_500_tasks(registry, cli_env, tmp_path):
    folder = synthesized_copy(tmp_path, 500)
    assert len(load_environment(folder).tasks) == 500
    pub = envkit("publish", str(folder), "--json", env=cli_env)
    assert pub.returncode == 0, pub.stderr
    published = json.loads(pub.stdout)
    with registry.client() as c:
        assert c.get("/environments/envkit/iso-many/versions/0.7.2").json()["task_count"] == 500
    import docker

    docker.from_env().images.remove(published["image_id"], force=True)
    pulled = envkit("pull", "envkit/iso-many@0.7.2", "--json", env=cli_env)
    assert pulled.returncode == 0, pulled.stderr
    result = json.loads(pulled.stdout)
    assert result["image_id"] == published["image_id"] and result["source"] == "rebuilt"
    env = load_environment(result["folder"])
    assert len(env.tasks) == 500
    task = env.tasks[499].id
    run = envkit("run", "envkit/iso-many@0.7.2", "--task", task, "--agent", "oracle", "--json", cwd=tmp_path,
                 env=cli_env)
    assert run.returncode == 0, run.stderr
    done = json.loads(run.stdout)
    assert done["reward"] == 1.0 and done["runtime"] == "gvisor"  # a pulled environment: under gVisor by default
