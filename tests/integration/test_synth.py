"""envkit synth against the real engine: the fixture project (tests/fixtures/minicalc) and one
real sdist become environments that build reproducibly and validate (oracle 1.0, null 0.0,
the default probes held); the fix is nowhere the agent can read; bad input is refused with
exit 2 and nothing left in --out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envkit.agents import ShellAgent, run_episode
from envkit.runtime import EnvRuntime
from envkit.spec import load_environment

from ..conftest import ROOT, envkit
from ..unit.test_cli_errors import assert_user_error
from ..unit.test_synth import helper
from .conftest import TEST_LABEL

MINICALC = ROOT / "tests" / "fixtures" / "minicalc"


@pytest.fixture(scope="module")
def minicalc_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "minicalc-env"
    proc = envkit("synth", str(MINICALC), "--out", str(out), "--max-tasks", "6", "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)
    assert figures["tasks"] == 6 and figures["baseline"]["stable"] == 22
    return out


def test_the_fixture_project_becomes_an_environment_that_validates(minicalc_env: Path):
    env = load_environment(minicalc_env)
    assert env.spec.image.python_lock == "python.lock" and env.spec.state.repo.python_path == "src"  # type: ignore[union-attr]
    provenance = json.loads((minicalc_env / "provenance.json").read_text())
    assert provenance["source"]["kind"] == "folder" and provenance["source"]["digest"].startswith("sha256:")
    assert provenance["config_changes"] == [
        "pyproject.toml addopts: '--cov=minicalc --cov-report=term-missing -ra' -> '-ra'"]
    assert provenance["candidates"]["tried"] == len(provenance["drops"]) + provenance["candidates"]["kept"]
    assert all(d["reason"] for d in provenance["drops"])
    for task in env.tasks:
        assert task.patch and task.params["fail_to_pass"] and task.oracle.endswith(".diff")
        assert "raise NotImplementedError" not in task.instruction and "@@" not in task.instruction  # never the patch
    first = envkit("build", str(minicalc_env), "--json")
    again = envkit("build", str(minicalc_env), "--json")
    assert first.returncode == 0 and json.loads(first.stdout)["image_id"] == json.loads(again.stdout)["image_id"]
    proc = envkit("validate", str(minicalc_env), "--sample", "3", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, [t["problems"] for t in report["tasks"]]
    assert len(report["tasks"]) == 3 and not report["probes"]["beaten"]
    assert {"report-patch", "always-equal", "exit-zero", "steal-oracle"} <= set(report["probes"]["run"])


def test_the_fix_is_nowhere_the_agent_can_read(minicalc_env: Path, client, tmp_path: Path):
    """The pristine code of the changed lines: not in the workspace, its git objects or
    history, the seed folder, the verifier's files, a .pyc, a pip cache or an sdist."""
    env = load_environment(minicalc_env)
    runtime = EnvRuntime(env, client=client, sandbox_runtime="runc")
    runtime.backend.labels.update(TEST_LABEL)
    task = next(t for t in env.tasks if t.params["family"] != "combo")
    fix = (minicalc_env / task.oracle).read_text()
    buggy = tmp_path / "buggy"
    shutil.copytree(minicalc_env / "repo", buggy)
    helper.apply_patch(str(buggy), (minicalc_env / str(task.patch)).read_bytes())
    seen = "".join(p.read_text() for p in buggy.rglob("*.py"))
    pristine = [line[1:].strip() for line in fix.splitlines() if line.startswith("+") and not line.startswith("+++")
                and len(line[1:].strip()) > 8 and line[1:].strip() not in seen]
    assert pristine, fix
    needle = pristine[0]
    search = (f"grep -rIlF -e {json.dumps(needle)} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head; "
              "echo ---; ls /seed/repo /seed/patches 2>&1 | head -3; git -C /workspace log --all --oneline | wc -l; "
              "find / -xdev \\( -name '*.pyc' -o -name '*.whl' -o -name '*.tar.gz' \\) -path '*minicalc*' "
              "2>/dev/null | head -3")
    result = run_episode(runtime, task, 0, ShellAgent(search))
    out = result.steps[0].stdout
    found, _, rest = out.partition("---\n")
    assert found.strip() == "", found  # no readable file holds the fixed line
    assert "Permission denied" in rest and rest.split("\n")[2].strip() == "1", rest  # one commit, the bug's
    assert result.reward == 0.0


def test_a_project_whose_tests_need_the_network_is_refused(tmp_path: Path):
    project = tmp_path / "netcalc"
    shutil.copytree(MINICALC, project)
    network = "import socket\n\n" + "".join(
        f"def test_fetch_{i}():\n    socket.create_connection(('pypi.invalid', 443), timeout=2).close()\n\n"
        for i in range(30))
    (project / "tests" / "test_network.py").write_text(network)
    out = tmp_path / "out"
    assert_user_error(envkit("synth", str(project), "--out", str(out)), "reaching the network", "offline")
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


@pytest.mark.slow
def test_a_real_sdist_becomes_an_environment_that_validates(tmp_path: Path):
    out = tmp_path / "iso"
    proc = envkit("synth", "pypi:isodate==0.7.2", "--out", str(out), "--max-tasks", "4", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    provenance = json.loads((out / "provenance.json").read_text())
    assert (provenance["source"]["digest"].startswith("sha256:")
            and provenance["source"]["origin"] == "isodate-0.7.2.tar.gz")
    assert provenance["baseline"]["stable"] >= 200
    proc = envkit("validate", str(out), "--sample", "2", "--probes", "none", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    unknown = envkit("synth", "pypi:isodate==0.0.999", "--out", str(tmp_path / "none"))
    assert_user_error(unknown, "could not download the source distribution of isodate==0.0.999")
    assert not (tmp_path / "none").exists()


def test_validate_sample_is_seeded(minicalc_env: Path):
    picks = []
    for _ in range(2):
        proc = envkit("validate", str(minicalc_env), "--sample", "2", "--seed", "5", "--probes", "none", "--json",
)
        picks.append([t["task_id"] for t in json.loads(proc.stdout)["tasks"]])
    assert picks[0] == picks[1] and len(picks[0]) == 2
