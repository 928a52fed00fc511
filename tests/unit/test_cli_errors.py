"""Bad input: one clear message saying what to do, exit code 2, no traceback."""

import subprocess
from pathlib import Path

import pytest

from ..conftest import envkit


def assert_user_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "error:" in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_malformed_toml(pyfix_copy: Path):
    (pyfix_copy / "envkit.toml").write_text("spec_version = 1\n[environment\n")
    assert_user_error(envkit("build", str(pyfix_copy)), "not valid TOML", "fix the TOML syntax")


def test_invalid_fields_all_reported(pyfix_copy: Path):
    spec = pyfix_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace('version = "1.0.0"', 'version = "one"').replace("pids = 256", "pids = 1"))
    proc = envkit("validate", str(pyfix_copy))
    assert_user_error(proc, "2 problems", "environment.version", "limits.pids", "fix:")


def test_missing_file(pyfix_copy: Path):
    (pyfix_copy / "tasks.jsonl").unlink()
    assert_user_error(envkit("build", str(pyfix_copy)), "tasks.file", "does not exist")


def test_missing_folder(tmp_path: Path):
    assert_user_error(envkit("build", str(tmp_path / "nowhere")), "no environment at")


def test_folder_without_spec(tmp_path: Path):
    assert_user_error(envkit("build", str(tmp_path)), "has no envkit.toml", "envkit init")


def test_unknown_env_ref():
    assert_user_error(envkit("validate", "envkit/pyfx@1.0.0"), "doesn't exist", "Did you mean `envkit/pyfix`?")


def test_unknown_version():
    assert_user_error(envkit("validate", "envkit/pyfix@9.9.9"), "has no version 9.9.9", "available: 1.0.0")


def test_malformed_ref():
    assert_user_error(envkit("validate", "Envkit/Py Fix@x"), "no environment at")


def test_unknown_task():
    assert_user_error(envkit("run", "environments/pyfix", "--task", "fix-medain"), "Did you mean `fix-median`?")


def test_unknown_agent():
    assert_user_error(envkit("run", "environments/pyfix", "--task", "fix-median", "--agent", "gpt"), "not an agent")


def test_docker_unreachable(tmp_path: Path):
    proc = envkit("build", "environments/pyfix", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert_user_error(proc, "Docker engine", "does not answer", "scripts/setup.sh")


def test_init_refuses_non_empty_folder(tmp_path: Path):
    (tmp_path / "keep.txt").write_text("precious")
    assert_user_error(envkit("init", str(tmp_path)), "not empty", "nothing was written")
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("kind", ["desktop", "nope"])
def test_init_unknown_kind(tmp_path: Path, kind: str):
    assert_user_error(envkit("init", str(tmp_path / "x"), "--kind", kind), "--kind repo")


def test_scaffold_is_a_valid_environment(tmp_path: Path):
    proc = envkit("init", str(tmp_path / "mine"), "--name", "team/mine")
    assert proc.returncode == 0, proc.stderr
    from envkit.spec import load_environment

    env = load_environment(tmp_path / "mine")
    assert env.ref == "team/mine@0.1.0" and [t.id for t in env.tasks] == ["fix-clamp", "add-mean"]


def test_validate_refuses_an_unknown_probe_set_or_task_before_starting(pyfix_copy: Path):
    assert_user_error(envkit("validate", str(pyfix_copy), "--probes", "some"), "not a probe set", "none, quick, all")
    assert_user_error(envkit("validate", str(pyfix_copy), "--task", "fix-medain"), "fix-median")


def test_run_refuses_an_unknown_probe_agent(pyfix_copy: Path):
    assert_user_error(envkit("run", str(pyfix_copy), "--task", "fix-median", "--agent", "probe:nope"), "names no probe",
                      "always-equal")
